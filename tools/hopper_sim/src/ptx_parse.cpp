// PTX text -> hsim::Module. A hand-written single-pass lexer + recursive-descent parser: nvcc's output
// (with CUTLASS inline asm pasted verbatim) is regular enough that no grammar tool is needed, and a
// direct scan over the text keeps 100 KB array initializers cheap.
#include <cstring>
#include <stdexcept>
#include <string_view>

#include "ptx_ir.h"

namespace hsim {
namespace {

using std::string_view;

// ---------------------------------------------------------------------------------------------
// Lexer

struct Tok {
  enum Kind : uint8_t { kEnd, kIdent, kNum, kStr, kPunct };
  Kind kind = kEnd;
  char c = 0;          // kPunct: the character
  string_view text;    // kIdent/kNum/kStr (kStr without the quotes)
  int line = 0;
};

inline bool ident_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '$' || c == '%' ||
         c == '.';
}
inline bool ident_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '$' || c == '.';
}
inline bool is_digit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  Lexer(const char* b, const char* e) : p_(b), e_(e) {}
  struct State { const char* p; int line; };
  State save() const { return {p_, line_}; }
  void restore(State s) { p_ = s.p; line_ = s.line; }
  int line() const { return line_; }

  Tok next() {
    skip_space();
    Tok t;
    t.line = line_;
    if (p_ >= e_) return t;
    const char* s = p_;
    char c = *p_;
    if (ident_start(c) && !(c == '.' && p_ + 1 < e_ && is_digit(p_[1]))) {
      ++p_;
      for (;;) {
        if (p_ < e_ && ident_char(*p_)) { ++p_; continue; }
        // `::` joins qualifier parts (shared::cta, mbarrier::complete_tx::bytes); a lone `:` ends
        // a label.
        if (p_ + 2 < e_ && p_[0] == ':' && p_[1] == ':' && ident_char(p_[2])) { p_ += 2; continue; }
        break;
      }
      t.kind = Tok::kIdent;
      t.text = string_view(s, p_ - s);
      return t;
    }
    if (is_digit(c) || c == '.') {
      // Numbers: 123, 0x1F, 0f3F800000, 0d..., 017, 0b101, 1.5, 1e-3, 12U.
      bool hexish = c == '0' && p_ + 1 < e_ &&
                    (p_[1] == 'x' || p_[1] == 'X' || p_[1] == 'f' || p_[1] == 'F' || p_[1] == 'd' ||
                     p_[1] == 'D' || p_[1] == 'b' || p_[1] == 'B');
      ++p_;
      while (p_ < e_) {
        char d = *p_;
        if (ident_char(d)) {
          ++p_;
          if (!hexish && (d == 'e' || d == 'E') && p_ < e_ && (*p_ == '+' || *p_ == '-')) ++p_;
          continue;
        }
        break;
      }
      t.kind = Tok::kNum;
      t.text = string_view(s, p_ - s);
      return t;
    }
    if (c == '"') {
      ++p_;
      while (p_ < e_ && *p_ != '"') {
        if (*p_ == '\\' && p_ + 1 < e_) ++p_;
        if (*p_ == '\n') ++line_;
        ++p_;
      }
      t.kind = Tok::kStr;
      t.text = string_view(s + 1, p_ - s - 1);
      if (p_ < e_) ++p_;
      return t;
    }
    ++p_;
    t.kind = Tok::kPunct;
    t.c = c;
    return t;
  }

  // Skips the rest of the current line (.loc, .file, @@DWARF).
  void skip_line() {
    while (p_ < e_ && *p_ != '\n') ++p_;
  }
  // Positioned just after a `{`: skips to after the matching `}` (a .section body).
  void skip_braced() {
    int depth = 1;
    while (p_ < e_ && depth > 0) {
      char c = *p_++;
      if (c == '\n') ++line_;
      else if (c == '{') ++depth;
      else if (c == '}') --depth;
      else if (c == '"') {
        while (p_ < e_ && *p_ != '"') { if (*p_ == '\n') ++line_; ++p_; }
        if (p_ < e_) ++p_;
      } else if (c == '/' && p_ < e_ && *p_ == '/') {
        skip_line();
      }
    }
  }

 private:
  void skip_space() {
    while (p_ < e_) {
      char c = *p_;
      if (c == '\n') { ++line_; ++p_; }
      else if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') ++p_;
      else if (c == '/' && p_ + 1 < e_ && p_[1] == '/') skip_line();
      else if (c == '/' && p_ + 1 < e_ && p_[1] == '*') {
        p_ += 2;
        while (p_ + 1 < e_ && !(p_[0] == '*' && p_[1] == '/')) { if (*p_ == '\n') ++line_; ++p_; }
        p_ = p_ + 2 <= e_ ? p_ + 2 : e_;
      } else break;
    }
  }
  const char* p_;
  const char* e_;
  int line_ = 1;
};

// ---------------------------------------------------------------------------------------------
// Tables

struct TypeInfo { uint32_t bytes; uint16_t bits; bool is_float, is_pred; };

bool type_info(string_view t, TypeInfo* out) {
  struct E { const char* n; TypeInfo i; };
  static const E kTypes[] = {
      {"pred", {1, 1, false, true}},   {"b8", {1, 8, false, false}},    {"u8", {1, 8, false, false}},
      {"s8", {1, 8, false, false}},    {"b16", {2, 16, false, false}},  {"u16", {2, 16, false, false}},
      {"s16", {2, 16, false, false}},  {"f16", {2, 16, true, false}},   {"bf16", {2, 16, true, false}},
      {"b32", {4, 32, false, false}},  {"u32", {4, 32, false, false}},  {"s32", {4, 32, false, false}},
      {"f32", {4, 32, true, false}},   {"f16x2", {4, 32, true, false}}, {"bf16x2", {4, 32, true, false}},
      {"tf32", {4, 32, true, false}},  {"b64", {8, 64, false, false}},  {"u64", {8, 64, false, false}},
      {"s64", {8, 64, false, false}},  {"f64", {8, 64, true, false}},   {"b128", {16, 128, false, false}},
      {"texref", {8, 64, false, false}}, {"samplerref", {8, 64, false, false}},
      {"surfref", {8, 64, false, false}},
  };
  for (const E& e : kTypes)
    if (t == e.n) { *out = e.i; return true; }
  return false;
}

const std::unordered_map<std::string, int32_t>& sreg_table() {
  static const std::unordered_map<std::string, int32_t> table = [] {
    std::unordered_map<std::string, int32_t> m;
    const char* xyz[] = {"x", "y", "z"};
    struct V { const char* n; int32_t c; };
    const V vecs[] = {{"tid", kSregTid},           {"ntid", kSregNtid},
                      {"ctaid", kSregCtaid},       {"nctaid", kSregNctaid},
                      {"clusterid", kSregClusterid}, {"nclusterid", kSregNclusterid},
                      {"cluster_ctaid", kSregClusterCtaid}, {"cluster_nctaid", kSregClusterNctaid}};
    for (const V& v : vecs)
      for (int i = 0; i < 3; ++i) m[std::string("%") + v.n + "." + xyz[i]] = v.c + i;
    const V scalars[] = {
        {"laneid", kSregLaneid}, {"warpid", kSregWarpid}, {"nwarpid", kSregNwarpid},
        {"smid", kSregSmid}, {"nsmid", kSregNsmid}, {"gridid", kSregGridid},
        {"cluster_ctarank", kSregClusterCtarank}, {"cluster_nctarank", kSregClusterNctarank},
        {"is_explicit_cluster", kSregIsExplicitCluster}, {"lanemask_eq", kSregLanemaskEq},
        {"lanemask_le", kSregLanemaskLe}, {"lanemask_lt", kSregLanemaskLt},
        {"lanemask_ge", kSregLanemaskGe}, {"lanemask_gt", kSregLanemaskGt}, {"clock", kSregClock},
        {"clock_hi", kSregClockHi}, {"clock64", kSregClock64}, {"globaltimer", kSregGlobaltimer},
        {"globaltimer_lo", kSregGlobaltimerLo}, {"globaltimer_hi", kSregGlobaltimerHi},
        {"dynamic_smem_size", kSregDynamicSmemSize}, {"total_smem_size", kSregTotalSmemSize},
        {"aggr_smem_size", kSregAggrSmemSize}};
    for (const V& v : scalars) m[std::string("%") + v.n] = v.c;
    for (int i = 0; i < 32; ++i) m["%envreg" + std::to_string(i)] = kSregEnvreg0 + i;
    return m;
  }();
  return table;
}

// Splits "a.b::c.d" at dots into parts (a leading dot is dropped).
void split_dots(string_view s, std::vector<string_view>* out) {
  out->clear();
  size_t i = (!s.empty() && s[0] == '.') ? 1 : 0;
  while (i <= s.size()) {
    size_t j = s.find('.', i);
    if (j == string_view::npos) j = s.size();
    out->push_back(s.substr(i, j - i));
    i = j + 1;
  }
}

uint64_t f64_bits(double d) { uint64_t u; std::memcpy(&u, &d, 8); return u; }
double bits_f64(uint64_t u) { double d; std::memcpy(&d, &u, 8); return d; }
uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// A parsed numeric literal.
struct Num {
  Operand::Kind kind = Operand::kImm;   // kImm, kF32 or kF64
  int64_t v = 0;                        // integer value or raw float bits
};

// ---------------------------------------------------------------------------------------------
// Parser

class Parser {
 public:
  Parser(const std::string& text, const std::string& src)
      : lx_(text.data(), text.data() + text.size()) {
    m_.source = src;
    advance();
  }

  Module run() {
    while (t_.kind != Tok::kEnd) module_statement();
    resolve_module_pending();
    return std::move(m_);
  }

 private:
  // Where an operand that names a not-yet-known label/symbol lives, for later patching.
  struct Ref {
    int32_t func;
    bool in_vec;          // Function::vec_elems[index] rather than code[instr].ops[index]
    uint32_t instr, index;
    std::string name;
    int line;
  };
  struct PendingReloc { int32_t sym; uint32_t reloc; std::string name; int line; };
  struct Scope {
    std::vector<std::string> regs, syms;                 // names to pop on close
    std::unordered_map<std::string, int32_t> labels;     // label -> instruction index
    std::vector<Ref> pending;                            // unresolved names used in this scope
  };

  Module m_;
  Lexer lx_;
  Tok t_;
  std::vector<string_view> parts_;      // scratch for split_dots
  // Name -> stack of definitions (innermost last), for shadowing by `{ }` scopes.
  std::unordered_map<std::string, std::vector<int32_t>> reg_names_, sym_names_;
  // `.reg .v2/.v4 .T v;`: the element registers of v (named v.x, v.y, v.z, v.w), for v as a whole
  std::unordered_map<std::string, std::vector<int32_t>> vec_reg_names_;
  std::vector<Scope> scopes_;
  int32_t fn_ = -1;                     // function being parsed
  std::vector<Ref> module_pending_;     // names still unknown at their function's end
  std::vector<PendingReloc> reloc_pending_;
  // .branchtargets lists of the function being parsed: name -> (label, line) list.
  std::unordered_map<std::string, std::vector<std::pair<std::string, int>>> branch_targets_;

  // --- token helpers ---
  void advance() { t_ = lx_.next(); }
  [[noreturn]] void fail(const std::string& msg, int line = -1) {
    throw std::runtime_error(m_.source + ":" + std::to_string(line < 0 ? t_.line : line) + ": " +
                             msg);
  }
  std::string cur_desc() const {
    switch (t_.kind) {
      case Tok::kEnd: return "end of input";
      case Tok::kPunct: return std::string("'") + t_.c + "'";
      case Tok::kStr: return "string \"" + std::string(t_.text) + "\"";
      default: return "'" + std::string(t_.text) + "'";
    }
  }
  bool is_punct(char c) const { return t_.kind == Tok::kPunct && t_.c == c; }
  bool is_ident(string_view s) const { return t_.kind == Tok::kIdent && t_.text == s; }
  void expect(char c, const char* what) {
    if (!is_punct(c)) fail(std::string("expected '") + c + "' " + what + ", found " + cur_desc());
    advance();
  }
  std::string expect_ident(const char* what) {
    if (t_.kind != Tok::kIdent) fail(std::string("expected ") + what + ", found " + cur_desc());
    std::string s(t_.text);
    advance();
    return s;
  }
  // Peeks whether the token after the current one is punctuation `c`.
  bool next_is_punct(char c) {
    Lexer::State s = lx_.save();
    Tok n = lx_.next();
    lx_.restore(s);
    return n.kind == Tok::kPunct && n.c == c;
  }

  // --- numbers ---
  bool parse_number_text(string_view s, Num* out) {
    if (s.empty()) return false;
    auto hexval = [](string_view h, uint64_t* v) {
      if (h.empty() || h.size() > 16) return false;
      uint64_t r = 0;
      for (char c : h) {
        int d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return false;
        r = r << 4 | d;
      }
      *v = r;
      return true;
    };
    if (s.size() > 1 && (s.back() == 'U' || s.back() == 'u') && s[1] != 'f' && s[1] != 'F' &&
        s[1] != 'd' && s[1] != 'D')
      s.remove_suffix(1);  // unsigned suffix of integer literals
    if (s.size() > 2 && s[0] == '0') {
      char k = s[1];
      uint64_t v;
      if (k == 'f' || k == 'F') {
        if (s.size() != 10 || !hexval(s.substr(2), &v)) return false;
        *out = {Operand::kF32, (int64_t)v};
        return true;
      }
      if (k == 'd' || k == 'D') {
        if (s.size() != 18 || !hexval(s.substr(2), &v)) return false;
        *out = {Operand::kF64, (int64_t)v};
        return true;
      }
      if (k == 'x' || k == 'X') {
        if (!hexval(s.substr(2), &v)) return false;
        *out = {Operand::kImm, (int64_t)v};
        return true;
      }
      if (k == 'b' || k == 'B') {
        v = 0;
        if (s.size() > 66) return false;
        for (char c : s.substr(2)) {
          if (c != '0' && c != '1') return false;
          v = v << 1 | (c - '0');
        }
        *out = {Operand::kImm, (int64_t)v};
        return true;
      }
    }
    bool is_float = false;
    for (char c : s) {
      if (c == '.' || c == 'e' || c == 'E') is_float = true;
      else if (!is_digit(c) && c != '+' && c != '-') return false;
    }
    if (is_float) {
      std::string tmp(s);
      char* end = nullptr;
      double d = std::strtod(tmp.c_str(), &end);
      if (end != tmp.c_str() + tmp.size()) return false;
      *out = {Operand::kF64, (int64_t)f64_bits(d)};
      return true;
    }
    uint64_t v = 0;
    if (s.size() > 1 && s[0] == '0') {  // octal
      for (char c : s) {
        if (c < '0' || c > '7') return false;
        v = v * 8 + (c - '0');
      }
    } else {
      for (char c : s) {
        if (!is_digit(c)) return false;
        v = v * 10 + (c - '0');
      }
    }
    *out = {Operand::kImm, (int64_t)v};
    return true;
  }
  // Parses [-]number at the current token.
  Num parse_number() {
    bool neg = false;
    if (is_punct('-')) { neg = true; advance(); }
    else if (is_punct('+')) advance();
    if (t_.kind != Tok::kNum) fail("expected a number, found " + cur_desc());
    Num n;
    if (!parse_number_text(t_.text, &n)) fail("malformed number '" + std::string(t_.text) + "'");
    advance();
    if (neg) {
      if (n.kind == Operand::kImm) n.v = (int64_t)(0 - (uint64_t)n.v);
      else if (n.kind == Operand::kF32) n.v ^= 0x80000000ll;
      else n.v = (int64_t)((uint64_t)n.v ^ 0x8000000000000000ull);
    }
    return n;
  }
  int64_t parse_int(const char* what) {
    Num n = parse_number();
    if (n.kind != Operand::kImm) fail(std::string("expected an integer for ") + what);
    return n.v;
  }

  // --- scopes ---
  void push_scope() { scopes_.emplace_back(); }
  void pop_scope() {
    Scope& s = scopes_.back();
    for (const std::string& n : s.regs) {
      auto it = reg_names_.find(n);
      it->second.pop_back();
      if (it->second.empty()) reg_names_.erase(it);
    }
    for (const std::string& n : s.syms) {
      auto it = sym_names_.find(n);
      it->second.pop_back();
      if (it->second.empty()) sym_names_.erase(it);
    }
    // Labels are visible in their whole block, so references made before the definition are
    // resolved only now; names not defined here move outwards.
    std::vector<Ref> pending = std::move(s.pending);
    std::unordered_map<std::string, int32_t> labels = std::move(s.labels);
    scopes_.pop_back();
    for (Ref& r : pending) {
      auto it = labels.find(r.name);
      // An address `[name]` never names a label: it waits for the module-scope lookup.
      if (it != labels.end() && ref_operand(r).kind != Operand::kMem) {
        Operand& op = ref_operand(r);
        op.kind = Operand::kLabel;
        op.imm = it->second;
      } else if (!scopes_.empty()) {
        scopes_.back().pending.push_back(std::move(r));
      } else {
        module_pending_.push_back(std::move(r));
      }
    }
  }
  Operand& ref_operand(const Ref& r) {
    Function& f = m_.functions[r.func];
    return r.in_vec ? f.vec_elems[r.index] : f.code[r.instr].ops[r.index];
  }
  int32_t lookup_reg(const std::string& name) const {
    auto it = reg_names_.find(name);
    return it == reg_names_.end() ? -1 : it->second.back();
  }
  int32_t lookup_sym(const std::string& name) const {
    auto it = sym_names_.find(name);
    if (it != sym_names_.end()) return it->second.back();
    auto g = m_.global_names.find(name);
    return g == m_.global_names.end() ? -1 : g->second;
  }
  void declare_scoped_sym(const std::string& name, int32_t idx) {
    sym_names_[name].push_back(idx);
    scopes_.back().syms.push_back(name);
  }
  void resolve_module_pending() {
    for (const Ref& r : module_pending_) {
      auto g = m_.global_names.find(r.name);
      if (g == m_.global_names.end()) fail("undefined label or symbol '" + r.name + "'", r.line);
      Operand& op = ref_operand(r);
      if (op.kind != Operand::kMem) op.kind = Operand::kSym;
      op.sym = g->second;
    }
    for (const PendingReloc& p : reloc_pending_) {
      auto g = m_.global_names.find(p.name);
      if (g == m_.global_names.end()) fail("undefined symbol '" + p.name + "' in initializer", p.line);
      m_.symbols[p.sym].relocs[p.reloc].sym = g->second;
    }
  }

  // --- module level ---
  void module_statement() {
    if (is_punct('@')) {  // @@DWARF lines of debug sections
      lx_.skip_line();
      advance();
      return;
    }
    if (t_.kind != Tok::kIdent || t_.text[0] != '.') fail("unexpected " + cur_desc() + " at module scope");
    string_view d = t_.text;
    if (d == ".version") {
      advance();
      if (t_.kind != Tok::kNum) fail("expected a version number");
      string_view v = t_.text;
      size_t dot = v.find('.');
      if (dot == string_view::npos) fail("malformed .version");
      m_.version_major = (uint32_t)std::stoul(std::string(v.substr(0, dot)));
      m_.version_minor = (uint32_t)std::stoul(std::string(v.substr(dot + 1)));
      advance();
    } else if (d == ".target") {
      advance();
      m_.target = expect_ident("a target name");
      while (is_punct(',')) { advance(); expect_ident("a target option"); }
    } else if (d == ".address_size") {
      advance();
      if (parse_int(".address_size") != 64) fail("only .address_size 64 is supported");
    } else if (d == ".file" || d == ".loc") {
      lx_.skip_line();
      advance();
    } else if (d == ".section") {
      // Debug sections: skip the name and the braced body (the lexer is past the '{').
      advance();
      while (t_.kind == Tok::kIdent) advance();
      if (!is_punct('{')) fail("expected '{' after .section");
      lx_.skip_braced();
      advance();
    } else if (d == ".pragma") {
      advance();
      if (t_.kind != Tok::kStr) fail("expected a string after .pragma");
      advance();
      expect(';', "after .pragma");
    } else {
      // [linkage] (.entry | .func | variable declaration)
      bool is_extern = false;
      for (;;) {
        if (is_ident(".extern")) { is_extern = true; advance(); }
        else if (is_ident(".visible") || is_ident(".weak") || is_ident(".common")) advance();
        else break;
      }
      if (is_ident(".entry")) { advance(); parse_function(true); }
      else if (is_ident(".func")) { advance(); parse_function(false); }
      else if (t_.kind == Tok::kIdent) {
        Symbol::Space sp;
        if (!space_of(t_.text, &sp)) fail("unknown directive " + cur_desc() + " at module scope");
        advance();
        parse_var_decl(sp, is_extern, /*owner=*/-1);
      } else {
        fail("unexpected " + cur_desc() + " at module scope");
      }
    }
  }

  static bool space_of(string_view d, Symbol::Space* sp) {
    if (d == ".global") *sp = Symbol::kGlobal;
    else if (d == ".const") *sp = Symbol::kConst;
    else if (d == ".shared") *sp = Symbol::kShared;
    else if (d == ".local") *sp = Symbol::kLocal;
    else if (d == ".param") *sp = Symbol::kParam;
    else if (d == ".tex") *sp = Symbol::kTexref;
    else return false;
    return true;
  }

  // The attribute words between a state space and the name: .align N, .v2/.v4/.v8, a type,
  // `.ptr [.space] [.align N]` (pointee attributes of kernel params, ignored), .attribute(...).
  struct DeclType {
    uint32_t align = 0, vec = 1;
    TypeInfo ti{0, 0, false, false};
    bool has_type = false;
  };
  DeclType parse_decl_type() {
    DeclType dt;
    bool ptr = false;
    while (t_.kind == Tok::kIdent && t_.text[0] == '.') {
      std::string word(t_.text);
      split_dots(t_.text, &parts_);
      std::vector<std::string> parts(parts_.begin(), parts_.end());
      advance();
      for (const std::string& p : parts) {
        TypeInfo ti;
        Symbol::Space sp;
        if (p == "align") {
          uint32_t a = (uint32_t)parse_int(".align");
          if (!ptr) dt.align = a;
        } else if (p == "v2" || p == "v4" || p == "v8") {
          dt.vec = p[1] - '0';
        } else if (type_info(p, &ti)) {
          dt.ti = ti;
          dt.has_type = true;
        } else if (p == "ptr") {
          ptr = true;
        } else if (ptr && space_of("." + p, &sp)) {
        } else if (p == "attribute") {  // .attribute(.managed) etc.
          expect('(', "after .attribute");
          while (!is_punct(')')) {
            if (t_.kind == Tok::kEnd) fail("unterminated .attribute");
            advance();
          }
          advance();
        } else {
          fail("unknown declaration attribute '" + word + "'");
        }
      }
    }
    if (!dt.has_type) fail("expected a type in declaration, found " + cur_desc());
    return dt;
  }

  // Parses `[.attrs] name[dims] [= init] {, name...};` after the state space. owner: the function
  // for function-scoped declarations (-1 at module scope). Returns the last symbol's index.
  int32_t parse_var_decl(Symbol::Space sp, bool is_extern, int32_t owner, bool single = false) {
    DeclType dt = parse_decl_type();
    int32_t last = -1;
    for (;;) {
      int line = t_.line;
      Symbol s;
      s.name = expect_ident("a variable name");
      s.space = sp;
      s.is_extern = is_extern;
      s.elem_bytes = dt.ti.bytes * dt.vec;
      s.align = dt.align ? dt.align : s.elem_bytes;
      s.func = owner;
      uint64_t count = 1;
      bool unsized = false;
      while (is_punct('[')) {
        advance();
        if (is_punct(']')) { unsized = true; advance(); continue; }
        count *= (uint64_t)parse_int("an array size");
        expect(']', "after an array size");
      }
      s.size = unsized ? 0 : count * s.elem_bytes;
      int32_t idx = (int32_t)m_.symbols.size();
      m_.symbols.push_back(std::move(s));
      if (is_punct('=')) {
        advance();
        parse_initializer(idx, dt);
        Symbol& sym = m_.symbols[idx];
        if (unsized) sym.size = (sym.init.size() + sym.elem_bytes - 1) / sym.elem_bytes * sym.elem_bytes;
        if (sym.init.size() > sym.size) fail("too many initializers for '" + sym.name + "'", line);
        sym.init.resize(sym.size, 0);
      }
      last = register_symbol(idx, owner, line);
      if (single) break;
      if (is_punct(',')) { advance(); continue; }
      expect(';', "after a declaration");
      break;
    }
    return last;
  }

  // Makes a declared symbol visible; returns the index that names it from now on.
  int32_t register_symbol(int32_t idx, int32_t owner, int line) {
    Symbol& s = m_.symbols[idx];
    if (owner == -2) {  // a function's formal/return parameter: visible in its body only
      declare_scoped_sym(s.name, idx);
    } else if (owner < 0) {
      auto it = m_.global_names.find(s.name);
      if (it != m_.global_names.end()) {
        // Earlier uses hold the first index, so it stays the module's symbol: a repeated
        // `.extern` is dropped, a definition after an `.extern` replaces its contents.
        int32_t first = it->second;
        Symbol& old = m_.symbols[first];
        if (old.space == Symbol::kFunc) fail("'" + s.name + "' redeclared as a variable", line);
        if (!old.is_extern && !s.is_extern) fail("duplicate definition of '" + s.name + "'", line);
        if (s.is_extern) return first;
        old = std::move(s);
        for (PendingReloc& p : reloc_pending_)
          if (p.sym == idx) p.sym = first;
        return first;
      }
      m_.global_names[s.name] = idx;
    } else {
      Function& f = m_.functions[owner];
      if (s.space == Symbol::kLocal) f.locals.push_back(idx);
      else if (s.space == Symbol::kShared) f.shared.push_back(idx);
      else if (s.space == Symbol::kParam) f.body_params.push_back(idx);
      else fail("only .local/.shared/.param declarations are supported in a function body", line);
      declare_scoped_sym(s.name, idx);
    }
    return idx;
  }

  // Writes initializer elements (flattening nested braces) at scalar positions.
  void parse_initializer(int32_t idx, const DeclType& dt) {
    uint64_t pos = 0;  // scalar element index
    std::vector<uint8_t>& init = m_.symbols[idx].init;
    uint64_t reserve = m_.symbols[idx].size;
    if (reserve) init.reserve(reserve);
    int depth = 0;
    for (;;) {
      if (is_punct('{')) { ++depth; advance(); continue; }
      if (is_punct('}')) {
        if (depth == 0) fail("unbalanced '}' in initializer");
        --depth;
        advance();
      } else {
        init_element(idx, dt, pos++);
      }
      if (depth == 0) break;
      if (is_punct(',')) { advance(); continue; }
      if (!is_punct('}')) fail("expected ',' or '}' in initializer, found " + cur_desc());
    }
  }
  void init_element(int32_t idx, const DeclType& dt, uint64_t pos) {
    uint32_t sb = dt.ti.bytes;
    uint64_t off = pos * sb;
    Symbol* s = &m_.symbols[idx];
    if (s->init.size() < off + sb) s->init.resize(off + sb, 0);
    if (t_.kind == Tok::kIdent) {
      // A symbol address: `name`, `generic(name)`, optionally `+ offset`.
      int line = t_.line;
      bool generic = false;
      std::string name;
      if (is_ident("generic")) {
        advance();
        expect('(', "after generic");
        name = expect_ident("a symbol name");
        expect(')', "after generic(name");
        generic = true;
      } else {
        name = expect_ident("a symbol name");
      }
      int64_t addend = 0;
      if (is_punct('+') || is_punct('-')) addend = parse_int("an address offset");
      int32_t target = lookup_sym(name);
      s = &m_.symbols[idx];
      s->relocs.push_back({off, target, addend, generic});
      if (target < 0) reloc_pending_.push_back({idx, (uint32_t)s->relocs.size() - 1, name, line});
      return;
    }
    Num n = parse_number();
    uint64_t bits = (uint64_t)n.v;
    if (dt.ti.is_float && !(sb == 2)) {
      // Convert the literal to the variable's float format.
      double d = n.kind == Operand::kImm ? (double)n.v
                 : n.kind == Operand::kF32 ? (double)bits_f32((uint32_t)bits)
                                           : bits_f64(bits);
      if (sb == 4 && n.kind != Operand::kF32) bits = f32_bits((float)d);
      else if (sb == 8 && n.kind != Operand::kF64) bits = f64_bits(d);
    }
    uint8_t* dst = s->init.data() + off;
    for (uint32_t i = 0; i < sb && i < 8; ++i) dst[i] = (uint8_t)(bits >> (8 * i));
    if (sb > 8 && n.v < 0)
      for (uint32_t i = 8; i < sb; ++i) dst[i] = 0xFF;
  }

  // --- functions ---
  void parse_function(bool is_entry) {
    int line = t_.line;
    std::vector<int32_t> rets, params;
    push_scope();  // parameter scope: visible in the body, gone after the function
    if (!is_entry && is_punct('(')) {
      advance();
      parse_param_list(&rets);
    }
    std::string name = expect_ident("a function name");
    // Find or create the function (a prototype and the later definition share one symbol).
    int32_t fi;
    auto it = m_.global_names.find(name);
    if (it != m_.global_names.end()) {
      Symbol& s = m_.symbols[it->second];
      if (s.space != Symbol::kFunc) fail("'" + name + "' redeclared as a function", line);
      fi = s.func;
    } else {
      fi = (int32_t)m_.functions.size();
      m_.functions.emplace_back();
      Function& f = m_.functions.back();
      f.name = name;
      f.is_entry = is_entry;
      Symbol s;
      s.name = name;
      s.space = Symbol::kFunc;
      s.is_entry = is_entry;
      s.func = fi;
      f.sym = (int32_t)m_.symbols.size();
      m_.symbols.push_back(std::move(s));
      m_.global_names[name] = f.sym;
    }
    for (int32_t r : rets) m_.symbols[r].func = fi;
    if (is_punct('(')) {
      advance();
      parse_param_list(&params);
    }
    for (int32_t p : params) m_.symbols[p].func = fi;
    {
      Function& f = m_.functions[fi];
      // A definition after a prototype: keep the prototype's parameter symbols (others may
      // already refer to them), updated to the definition's names and sizes.
      auto merge = [&](std::vector<int32_t>& have, std::vector<int32_t>& now) {
        if (have.empty()) { have = now; return; }
        if (have.size() != now.size()) fail("parameters of '" + name + "' differ from its declaration", line);
        for (size_t i = 0; i < have.size(); ++i) {
          m_.symbols[have[i]] = m_.symbols[now[i]];
          sym_names_[m_.symbols[now[i]].name].back() = have[i];
        }
      };
      merge(f.rets, rets);
      merge(f.params, params);
    }
    // Performance directives.
    Function* f = &m_.functions[fi];
    while (t_.kind == Tok::kIdent && t_.text[0] == '.') {
      string_view d = t_.text;
      advance();
      auto dims = [&](uint32_t* out) {
        for (int i = 0; i < 3; ++i) {
          out[i] = (uint32_t)parse_int("a launch dimension");
          if (!is_punct(',')) break;
          advance();
        }
        for (int i = 0; i < 3; ++i) if (!out[i]) out[i] = 1;
      };
      if (d == ".maxntid") dims(f->maxntid);
      else if (d == ".reqntid") dims(f->reqntid);
      else if (d == ".reqnctapercluster") dims(f->reqnctapercluster);
      else if (d == ".minnctapersm") f->minnctapersm = (uint32_t)parse_int(".minnctapersm");
      else if (d == ".maxnreg") f->maxnreg = (uint32_t)parse_int(".maxnreg");
      else if (d == ".maxclusterrank") f->maxclusterrank = (uint32_t)parse_int(".maxclusterrank");
      else if (d == ".explicitcluster") f->explicitcluster = true;
      else if (d == ".noreturn") {}
      else if (d == ".pragma") {
        if (t_.kind != Tok::kStr) fail("expected a string after .pragma");
        advance();
        expect(';', "after .pragma");
      } else fail("unknown function directive '" + std::string(d) + "'");
    }
    if (is_punct(';')) {  // prototype only
      advance();
      pop_scope();
      return;
    }
    if (!is_punct('{')) fail("expected '{' or ';' after the header of '" + name + "', found " + cur_desc());
    if (f->has_body) fail("function '" + name + "' defined twice", line);
    f->has_body = true;
    advance();
    fn_ = fi;
    branch_targets_.clear();
    parse_body();
    fn_ = -1;
    pop_scope();  // parameter scope
  }

  void parse_param_list(std::vector<int32_t>* out) {
    while (!is_punct(')')) {
      if (!is_ident(".param") && !is_ident(".reg"))
        fail("expected .param in a parameter list, found " + cur_desc());
      if (is_ident(".reg")) fail(".reg parameters are not supported");
      advance();
      int32_t idx = parse_var_decl(Symbol::kParam, false, /*owner=*/-2, /*single=*/true);
      out->push_back(idx);
      if (is_punct(',')) advance();
      else if (!is_punct(')')) fail("expected ',' or ')' in a parameter list, found " + cur_desc());
    }
    advance();
  }

  // Body statements until the closing brace of the function.
  void parse_body() {
    size_t base_depth = scopes_.size();
    push_scope();
    while (scopes_.size() > base_depth) {
      if (t_.kind == Tok::kEnd) fail("unexpected end of input in the body of '" + fn().name + "'");
      if (is_punct('{')) { advance(); push_scope(); continue; }
      if (is_punct('}')) { advance(); pop_scope(); continue; }
      if (is_punct('@')) { parse_instruction(); continue; }
      if (is_punct(';')) { advance(); continue; }  // empty statement (inline asm `;;`)
      if (t_.kind != Tok::kIdent) fail("unexpected " + cur_desc() + " in a function body");
      string_view w = t_.text;
      if (w[0] == '.') {
        Symbol::Space sp;
        if (w == ".reg") { advance(); parse_reg_decl(); }
        else if (w == ".pragma") {
          advance();
          if (t_.kind != Tok::kStr) fail("expected a string after .pragma");
          advance();
          expect(';', "after .pragma");
        } else if (w == ".loc" || w == ".file") { lx_.skip_line(); advance(); }
        else if (space_of(w, &sp)) { advance(); parse_var_decl(sp, false, fn_); }
        else fail("unknown directive '" + std::string(w) + "' in a function body");
        continue;
      }
      if (next_is_punct(':')) { parse_label(); continue; }
      parse_instruction();
    }
  }
  Function& fn() { return m_.functions[fn_]; }

  void parse_label() {
    int line = t_.line;
    std::string name(t_.text);
    advance();
    advance();  // ':'
    if (is_ident(".callprototype")) {
      // `proto: .callprototype (ret) _ (params);` names the signature of an indirect call. The
      // call's last operand refers to it; a kFunc symbol without a function stands for it.
      while (!is_punct(';')) {
        if (t_.kind == Tok::kEnd) fail("unterminated .callprototype", line);
        advance();
      }
      advance();
      Symbol s;
      s.name = name;
      s.space = Symbol::kFunc;
      int32_t idx = (int32_t)m_.symbols.size();
      m_.symbols.push_back(std::move(s));
      declare_scoped_sym(name, idx);
      return;
    }
    if (is_ident(".branchtargets")) {
      // `ts: .branchtargets L1, L2;` names the target list of `brx.idx %r, ts`; an operand naming
      // it becomes a kVec of labels.
      advance();
      std::vector<std::pair<std::string, int>>& list = branch_targets_[name];
      list.clear();
      for (;;) {
        list.push_back({std::string(t_.text), t_.line});
        expect_ident("a label in .branchtargets");
        if (is_punct(',')) { advance(); continue; }
        expect(';', "after .branchtargets");
        break;
      }
      return;
    }
    auto& labels = scopes_.back().labels;
    if (labels.count(name)) fail("duplicate label '" + name + "'", line);
    labels[name] = (int32_t)fn().code.size();
  }

  void parse_reg_decl() {
    DeclType dt = parse_decl_type();
    for (;;) {
      std::string name = expect_ident("a register name");
      RegInfo ri;
      ri.bits = (uint16_t)(dt.ti.bits * dt.vec);
      ri.is_pred = dt.ti.is_pred;
      ri.is_float = dt.ti.is_float;
      Function& f = fn();
      Scope& sc = scopes_.back();
      if (dt.vec > 1) {
        // a vector variable: one register per element, accessed as v.x/.y/.z/.w (or .r/.g/.b/.a)
        if (dt.vec > 4) fail("a .reg vector of more than 4 elements");
        if (is_punct('<')) fail("a parameterized .reg vector (%v<N>) is not supported");
        ri.bits = (uint16_t)dt.ti.bits;
        std::vector<int32_t>& elems = vec_reg_names_[name];
        elems.clear();
        static const char* xyzw[] = {".x", ".y", ".z", ".w"};
        static const char* rgba[] = {".r", ".g", ".b", ".a"};
        for (uint32_t i = 0; i < dt.vec; ++i) {
          elems.push_back((int32_t)f.regs.size());
          for (const char* sfx : {xyzw[i], rgba[i]}) {
            reg_names_[name + sfx].push_back((int32_t)f.regs.size());
            sc.regs.push_back(name + sfx);
          }
          ri.name = name + xyzw[i];
          f.regs.push_back(ri);
        }
        if (is_punct(',')) { advance(); continue; }
        expect(';', "after a .reg declaration");
        break;
      }
      if (is_punct('<')) {  // %r<N>: N registers %r0 .. %r(N-1)
        advance();
        int64_t n = parse_int("a register count");
        expect('>', "after a register count");
        if (n < 0 || n > (1 << 24)) fail("bad register count");
        for (int64_t i = 0; i < n; ++i) {
          ri.name = name + std::to_string(i);
          reg_names_[ri.name].push_back((int32_t)f.regs.size());
          sc.regs.push_back(ri.name);
          f.regs.push_back(ri);
        }
      } else {
        ri.name = name;
        reg_names_[name].push_back((int32_t)f.regs.size());
        sc.regs.push_back(name);
        f.regs.push_back(ri);
      }
      if (is_punct(',')) { advance(); continue; }
      expect(';', "after a .reg declaration");
      break;
    }
  }

  // --- instructions ---
  void parse_instruction() {
    Instr in;
    in.line = t_.line;
    if (is_punct('@')) {
      advance();
      if (is_punct('!')) { in.guard_neg = true; advance(); }
      std::string g = expect_ident("a guard predicate");
      in.guard = lookup_reg(g);
      if (in.guard < 0) fail("unknown guard predicate '" + g + "'");
    }
    if (t_.kind != Tok::kIdent || t_.text[0] == '.') fail("expected an instruction, found " + cur_desc());
    split_dots(t_.text, &parts_);
    in.opcode = std::string(parts_[0]);
    for (size_t i = 1; i < parts_.size(); ++i) {
      if (parts_[i].empty()) fail("malformed opcode '" + std::string(t_.text) + "'");
      in.mods.emplace_back(parts_[i]);
    }
    advance();
    Function& f = fn();
    uint32_t instr_idx = (uint32_t)f.code.size();
    if (!is_punct(';')) {
      for (;;) {
        in.ops.push_back(parse_operand(instr_idx, (uint32_t)in.ops.size(), /*vec_slot=*/-1));
        if (is_punct('|')) {
          // `%r|%p` (setp, shfl, elect ...): a pair of destinations, kept as a two-element kVec.
          advance();
          Operand a = in.ops.back();
          Operand v;
          v.kind = Operand::kVec;
          v.vec_begin = (uint32_t)fn().vec_elems.size();
          v.vec_count = 2;
          fn().vec_elems.push_back(a);
          fn().vec_elems.push_back(Operand());
          fn().vec_elems.back() = parse_operand(instr_idx, 0, (int64_t)v.vec_begin + 1);
          if (a.kind != Operand::kReg && a.kind != Operand::kSink)
            fail("expected a register before '|'");
          in.ops.back() = v;
        }
        if (is_punct(',')) { advance(); continue; }
        if (is_punct(';')) break;
        fail("expected ',' or ';' after an operand of '" + in.opcode + "', found " + cur_desc());
      }
    }
    advance();  // ';'
    if (in.opcode == "call") normalize_call(&in);
    fn().code.push_back(std::move(in));
  }

  // call [(rets),] callee [, (args)] [, prototype]  ->  ops = {kVec rets, callee, kVec args [, proto]}
  void normalize_call(Instr* in) {
    Operand empty;
    empty.kind = Operand::kVec;
    empty.vec_begin = (uint32_t)fn().vec_elems.size();
    std::vector<Operand>& ops = in->ops;
    std::vector<Operand> out;
    std::vector<uint32_t> moved(ops.size());  // old operand index -> new index
    size_t i = 0;
    auto take = [&] { moved[i] = (uint32_t)out.size(); out.push_back(ops[i++]); };
    if (i < ops.size() && ops[i].kind == Operand::kVec) take(); else out.push_back(empty);
    if (i == ops.size() || ops[i].kind == Operand::kVec) fail("call without a callee", in->line);
    take();
    if (i < ops.size() && ops[i].kind == Operand::kVec) take(); else out.push_back(empty);
    if (i < ops.size() && ops[i].kind != Operand::kVec) take();  // the .callprototype
    if (i != ops.size()) fail("malformed operand list of call", in->line);
    // Refs to still-unknown names point at operand positions: move them along.
    uint32_t instr_idx = (uint32_t)fn().code.size();
    for (Scope& sc : scopes_)
      for (Ref& r : sc.pending)
        if (r.func == fn_ && !r.in_vec && r.instr == instr_idx) r.index = moved[r.index];
    ops = std::move(out);
  }

  Operand make_vec(std::vector<Operand>& elems) {
    Operand v;
    v.kind = Operand::kVec;
    v.vec_begin = (uint32_t)fn().vec_elems.size();
    v.vec_count = (uint32_t)elems.size();
    for (Operand& e : elems) fn().vec_elems.push_back(e);
    return v;
  }

  // Parses `{a, b}` or `(a, b)` into consecutive vec_elems. Elements are parsed into a temporary
  // list first (pending refs then get patched to their final slot).
  Operand parse_list(char close, uint32_t instr_idx) {
    advance();
    std::vector<Operand> elems;
    std::vector<std::pair<size_t, size_t>> pend;  // (elem index, index into the pending list)
    Scope& sc = scopes_.back();
    while (!is_punct(close)) {
      size_t before = sc.pending.size();
      elems.push_back(parse_operand(instr_idx, 0, -2));
      if (sc.pending.size() > before) pend.push_back({elems.size() - 1, before});
      if (is_punct(',')) { advance(); continue; }
      if (!is_punct(close)) fail(std::string("expected ',' or '") + close + "' in a list, found " + cur_desc());
    }
    advance();
    Operand v = make_vec(elems);
    for (auto& p : pend) {
      Ref& r = scopes_.back().pending[p.second];
      r.in_vec = true;
      r.index = v.vec_begin + (uint32_t)p.first;
    }
    return v;
  }

  // vec_slot: -1 = operand goes to ops[op_index]; >= 0: lives at vec_elems[vec_slot];
  // -2: list element whose final slot parse_list patches.
  Operand parse_operand(uint32_t instr_idx, uint32_t op_index, int64_t vec_slot) {
    Operand op;
    if (is_punct('{')) {
      if (vec_slot != -1) fail("nested vector operand");
      return parse_list('}', instr_idx);
    }
    if (is_punct('(')) {
      if (vec_slot != -1) fail("nested operand list");
      return parse_list(')', instr_idx);
    }
    if (is_punct('!')) {
      advance();
      op = parse_operand(instr_idx, op_index, vec_slot);
      if (op.kind != Operand::kReg) fail("'!' applies to a predicate register only");
      op.neg = true;
      return op;
    }
    if (is_punct('[')) return parse_mem(instr_idx, op_index, vec_slot);
    if (t_.kind == Tok::kNum || is_punct('-') || is_punct('+')) {
      Num n = parse_number();
      op.kind = n.kind;
      op.imm = n.v;
      return op;
    }
    if (t_.kind != Tok::kIdent) fail("unexpected " + cur_desc() + " in an operand");
    int line = t_.line;
    std::string name(t_.text);
    advance();
    if (name == "_") { op.kind = Operand::kSink; return op; }
    int32_t r = lookup_reg(name);
    if (r >= 0) { op.kind = Operand::kReg; op.reg = r; return op; }
    auto vr = vec_reg_names_.find(name);
    if (vr != vec_reg_names_.end()) {   // a .reg vector variable as a whole: {v.x, v.y, ...}
      if (vec_slot != -1) fail("a vector variable inside a vector operand", line);
      std::vector<Operand> elems(vr->second.size());
      for (size_t i = 0; i < elems.size(); ++i) { elems[i].kind = Operand::kReg; elems[i].reg = vr->second[i]; }
      return make_vec(elems);
    }
    if (name[0] == '%') {
      auto& st = sreg_table();
      auto it = st.find(name);
      if (it == st.end()) fail("unknown register '" + name + "'", line);
      op.kind = Operand::kSreg;
      op.imm = it->second;
      return op;
    }
    auto bt = branch_targets_.find(name);
    if (bt != branch_targets_.end()) {
      if (vec_slot != -1) fail("a .branchtargets list inside a vector", line);
      Operand v;
      v.kind = Operand::kVec;
      v.vec_begin = (uint32_t)fn().vec_elems.size();
      v.vec_count = (uint32_t)bt->second.size();
      for (const auto& l : bt->second) {
        Operand e;
        e.kind = Operand::kLabel;
        e.imm = -1;
        add_pending(l.first, l.second, instr_idx, 0, (int64_t)fn().vec_elems.size());
        fn().vec_elems.push_back(e);
      }
      return v;
    }
    int32_t s = lookup_sym(name);
    if (s >= 0) {
      op.kind = Operand::kSym;
      op.sym = s;
    } else {
      // A label (possibly defined further down) or a module symbol declared later.
      op.kind = Operand::kLabel;
      op.imm = -1;
      add_pending(name, line, instr_idx, op_index, vec_slot);
    }
    if (op.kind == Operand::kSym && (is_punct('+') || is_punct('-')))
      op.imm = parse_int("a symbol offset");  // `sym+8` as a value
    return op;
  }

  void add_pending(const std::string& name, int line, uint32_t instr_idx, uint32_t op_index,
                   int64_t vec_slot) {
    Ref r;
    r.func = fn_;
    r.in_vec = vec_slot >= 0;
    r.instr = instr_idx;
    r.index = vec_slot >= 0 ? (uint32_t)vec_slot : op_index;
    r.name = name;
    r.line = line;
    scopes_.back().pending.push_back(std::move(r));
  }

  // [reg], [reg+imm], [reg+-imm], [sym], [sym+imm], [imm], [tmap, {coords}]
  Operand parse_mem(uint32_t instr_idx, uint32_t op_index, int64_t vec_slot) {
    advance();
    Operand op;
    op.kind = Operand::kMem;
    if (t_.kind == Tok::kIdent) {
      int line = t_.line;
      std::string name(t_.text);
      advance();
      int32_t r = lookup_reg(name);
      if (r >= 0) op.reg = r;
      else {
        if (name[0] == '%') fail("unknown register '" + name + "' in an address", line);
        op.sym = lookup_sym(name);
        if (op.sym < 0) add_pending(name, line, instr_idx, op_index, vec_slot);
      }
      if (is_punct('+')) {
        advance();
        op.imm = parse_int("an address offset");
      } else if (is_punct('-')) {
        op.imm = parse_int("an address offset");
      }
    } else {
      op.imm = parse_int("an address");
    }
    if (is_punct(',')) {
      // Tensor coordinates of cp.async.bulk.tensor & co: kept in the kMem's vec range.
      advance();
      if (!is_punct('{')) fail("expected '{' with tensor coordinates, found " + cur_desc());
      Operand v = parse_list('}', instr_idx);
      op.vec_begin = v.vec_begin;
      op.vec_count = v.vec_count;
    }
    expect(']', "to close an address");
    return op;
  }
};

}  // namespace

Module parse_ptx(const std::string& text, const std::string& source_name) {
  Parser p(text, source_name);
  return p.run();
}

}  // namespace hsim
