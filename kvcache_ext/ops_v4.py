"""`kvcache_ext.ops_v4`: the module kvcache_ext.ops.v4 (DeepSeek-V4's row ops) under its
earlier name; importing either gives the same module object."""
import sys

from .ops import v4 as _v4

sys.modules[__name__] = _v4
