"""Integrations of flash3 with other libraries.

Each integration is a submodule imported on demand, so ``import flash3`` never
imports a third-party library:

* :mod:`flash3.integrations.transformers` -- Hugging Face transformers'
  attention registry (``pip install flash3[transformers]``).
"""
