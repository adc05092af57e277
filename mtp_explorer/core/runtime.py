"""The C++ runtime of the native libraries: each must use the shared one.

A toolchain that links libstdc++ statically into every shared library (seen on the device machines: GCC 13.3 in
``/opt/gcc``, the default ``CXX`` there) gives libllama, ggml and the extension a copy each, and a session then
crashed as it opened (SIGSEGV in ``llama_model::print_info``, on CUDA and CPU-only builds). Sessions refuse such a
build with a :class:`~mtp_explorer.LibraryError` instead (:func:`check_shared_cxx_runtime`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path

from .errors import LibraryError

CXX_RUNTIMES = ("libstdc++.so", "libc++.so")
"""The shared C++ runtimes (GCC's, LLVM's): a C++ library that names neither among its needed libraries holds its
own."""

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB = 0, 1, 5


def needed_libraries(path: str | Path) -> list[str] | None:
    """The libraries the ELF shared object at ``path`` names as needed (its ``DT_NEEDED`` entries, in order), or
    ``None`` where it is not an ELF file (another platform's format)."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF":
        return None
    wide, order = data[4] == 2, "<" if data[5] == 1 else ">"
    if wide:
        phoff, phentsize, phnum = struct.unpack_from(order + "Q14xHH", data, 32)
        phdr, dyn = order + "II6Q", order + "qQ"
    else:
        phoff, phentsize, phnum = struct.unpack_from(order + "I10xHH", data, 28)
        phdr, dyn = order + "8I", order + "iI"
    loads, dynamic = [], None
    for i in range(phnum):
        fields = struct.unpack_from(phdr, data, phoff + i * phentsize)
        if wide:
            p_type, _, p_offset, p_vaddr, _, p_filesz = fields[:6]
        else:
            p_type, p_offset, p_vaddr, _, p_filesz = fields[:5]
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return []
    entries = []
    for at in range(dynamic[0], dynamic[0] + dynamic[1], struct.calcsize(dyn)):
        tag, value = struct.unpack_from(dyn, data, at)
        if tag == _DT_NULL:
            break
        entries.append((tag, value))
    strtab = next((v for t, v in entries if t == _DT_STRTAB), None)
    base = next((o + strtab - v for v, o, n in loads if strtab is not None and v <= strtab < v + n), None)
    if base is None:
        raise LibraryError(f"{path}: its dynamic section has no string table in a loaded segment")
    return [data[base + v : data.index(b"\0", base + v)].decode() for t, v in entries if t == _DT_NEEDED]


def native_libraries(extension: str | Path, libllama: str | Path) -> list[Path]:
    """The extension and the libraries it loads from libllama's folder (libllama, ggml and its backends), each once."""
    folder = Path(libllama).parent
    found: list[Path] = []
    todo = [Path(extension), Path(libllama)]
    while todo:
        lib = todo.pop(0)
        if not lib.is_file() or any(lib.samefile(f) for f in found):  # libllama.so and libllama.so.0: one file
            continue
        found.append(lib)
        todo += [folder / name for name in needed_libraries(lib) or []]
    return found


def check_shared_cxx_runtime(libraries: Iterable[str | Path]) -> None:
    """Raise :class:`LibraryError` naming each of ``libraries`` (ELF files) that holds its own C++ runtime."""
    static = [
        str(lib)
        for lib in libraries
        if (needed := needed_libraries(lib)) is not None and not any(n.startswith(CXX_RUNTIMES) for n in needed)
    ]
    if static:
        raise LibraryError(
            f"{', '.join(static)} link{'s' if len(static) == 1 else ''} the C++ runtime statically (no libstdc++.so or "
            "libc++.so among the needed libraries), so libllama, ggml and the extension each hold a copy of it and a "
            "session crashes as it opens; rebuild llama-cpp-python and mtp-explorer with a compiler that links "
            "libstdc++ shared (such as CXX=/usr/bin/g++ where the default g++ adds -static-libstdc++)"
        )
