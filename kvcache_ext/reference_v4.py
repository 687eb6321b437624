"""`kvcache_ext.reference_v4`: the module kvcache_ext.reference.v4 (DeepSeek-V4's reference)
under its earlier name; importing either gives the same module object."""
import sys

from .reference import v4 as _v4

sys.modules[__name__] = _v4
