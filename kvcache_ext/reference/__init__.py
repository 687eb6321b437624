"""Layer 3, the pure-torch reference of every op: the ground truth kernels are compared with.
`kvcache_ext.reference` is DeepSeek-V3.2's rows, plain K/V rows and their reads (v32.py);
`kvcache_ext.reference.v4` (also importable as `kvcache_ext.reference_v4`) DeepSeek-V4's."""
from .v32 import *  # noqa: F401,F403  (the module's __all__)
from .v32 import __all__  # noqa: F401
