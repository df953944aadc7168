#!/usr/bin/env bash
# A deliberately wrong kernel must be caught: a copy of csrc/ whose causal rows see one key too
# many (Mask::last_key in csrc/flash3/common/attn_logic.h, which the kernels' masks and key-block
# ranges use) is built for bf16 d 64 (FLASH3_SIM_CSRC) and its causal smoke case run in the
# simulator; it must come out "wrong". Exit 0 only then.
set -uo pipefail
cd "$(dirname "$0")/../../.."
PY=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r csrc "$tmp/csrc"
sed -i 's/row_end - 1 + offset() + right + 1)/row_end - 1 + offset() + right + 2)/' "$tmp/csrc/flash3/common/attn_logic.h"
if cmp -s csrc/flash3/common/attn_logic.h "$tmp/csrc/flash3/common/attn_logic.h"; then
  echo "mutant_check: the mutation did not apply (attn_logic.h changed?)"; exit 1
fi
FLASH3_SIM_CSRC="$tmp/csrc" FLASH3_HDIMS=64 FLASH3_DTYPES=bf16 "$PY" tools/smoke.py --backend sim \
  --cases bf16:64:64/causal --json "$tmp/smoke.json" > "$tmp/log" 2>&1
status=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["cases"][0]["status"])' "$tmp/smoke.json" 2>/dev/null)
if [ "$status" = wrong ]; then
  echo "mutant_check: causal rows seeing one key too many: caught ($(grep -m1 'bf16 64 causal: wrong' "$tmp/log" | sed 's/^ *//'))"
  exit 0
fi
echo "mutant_check: the wrong kernel was NOT caught (status '$status'):"; tail -20 "$tmp/log"; exit 1
