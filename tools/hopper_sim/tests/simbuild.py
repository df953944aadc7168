"""Building small CUDA test programs for the simulator (shared by run_checks.py and run_isa.py):
the sim nvcc flags, a build cache keyed by a hash of the sources, flags, patches and nvcc version,
and making the simulator library first."""
import hashlib
import os
import re
import shutil
import subprocess

SIM = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIMRUN = os.path.join(SIM, "simrun")
FLAGS = ["-gencode=arch=compute_90a,code=[sm_90a,compute_90a]", "-cudart", "shared", "-no-compress", "-O3",
         "-std=c++17"]


def nvcc_version():
    try:
        return subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    except OSError:
        return ""


def prepare(no_make):
    """nvcc present and the simulator library built; returns an error message or None."""
    if not shutil.which("nvcc"):
        return "nvcc not on PATH"
    if not no_make:
        r = subprocess.run(["make", "-s", "-C", SIM, "lib"], capture_output=True, text=True)
        if r.returncode:
            return r.stdout + r.stderr + "\nbuilding the simulator library failed"
    return None


def build(prog, src_dir, header, out_dir, nvver, patches=()):
    """Builds src_dir/prog.cu (which includes src_dir/header) into out_dir/prog-<hash>; `patches` are
    (old, new) byte strings of equal length replaced once each in the binary (PTX text ptxas would
    refuse). Returns (exe or None, error or None, built now)."""
    src = os.path.join(src_dir, prog + ".cu")
    h = hashlib.sha256()
    for p in (src, os.path.join(src_dir, header)):
        with open(p, "rb") as f:
            h.update(f.read())
    h.update(repr((FLAGS, list(patches), nvver)).encode())
    exe = os.path.join(out_dir, "%s-%s" % (prog, h.hexdigest()[:12]))
    if os.path.exists(exe):
        return exe, None, False
    os.makedirs(out_dir, exist_ok=True)
    tmp = exe + ".tmp%d" % os.getpid()
    r = subprocess.run(["nvcc", *FLAGS, "-I", src_dir, src, "-o", tmp], capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stdout + r.stderr, True
    if patches:
        with open(tmp, "rb") as f:
            data = f.read()
        for old, new in patches:
            assert len(old) == len(new)
            if data.count(old) != 1:
                return None, "patch %r found %d times in the binary (want 1)" % (old, data.count(old)), True
            data = data.replace(old, new)
        with open(tmp, "wb") as f:
            f.write(data)
    os.chmod(tmp, 0o755)
    os.replace(tmp, exe)
    for old in os.listdir(out_dir):   # drop stale builds of this program
        if re.fullmatch(re.escape(prog) + r"-[0-9a-f]{12}", old) and os.path.join(out_dir, old) != exe:
            try:
                os.remove(os.path.join(out_dir, old))
            except OSError:
                pass
    return exe, None, True
