# How this copy of flash3 was built. setup.py overwrites the installed copy; this placeholder is
# what a source checkout or an editable install sees.
CUDA_EXTENSION = None  # True: flash3._C was built; False: pure-Python install, REASON says why
REASON = "no build record (flash3 imported from a source tree or an editable install)"
KERNELS = []  # names of the compiled kernel TUs, e.g. "fwd_bf16_hdim128_sm90"
TORCH = None  # torch version the extension was built against
