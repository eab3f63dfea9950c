# What a real Python process that imports torch runs, seen from inside it: the oracle of
# tests/python_process.rs (tests/common/torch_process.rs launches it). Run as
#   python -c "exec(compile(open(PROBE).read(), PROBE, 'exec'))"
# so that sys.path[0] is '' (the cwd) as for any `python -c`, and torch's own NCCL
# preload (torch/__init__.py: nvidia/nccl/lib from the first sys.path entry holding it)
# runs as it would for the user. It imports torch itself, so an import that fails is an
# answer too. It writes one JSON object to the file named by FDL_PROBE_OUT:
#   import_error     null, or the text of the exception `import torch` raised
#   torch_version    torch.__version__, torch_file torch.__file__
#   mapped_nccl      files mapped (per /proc/self/maps) whose basename starts with
#                    libnccl.so, in order of first appearance, after the import
#   libtorch_cuda    the libtorch_cuda.so mapped (null when none is)
#   calls_reach      for each nccl* symbol libtorch_cuda.so imports through a GLOB_DAT,
#                    JUMP_SLOT or 64 relocation: the mapped file its GOT slot points into
#   unbound          "symbol: why" for slots that point nowhere, into libtorch_cuda's
#                    own PLT (lazy, not bound yet) or that disagree between relocations
#   nccl_versions    ncclGetVersion of each mapped libnccl.so file (already loaded:
#                    dlopen'd with RTLD_NOLOAD, so the probe loads nothing itself)
#   unique_id_ok     whether torch.cuda.nccl.unique_id() (NCCL's bootstrap, no GPU
#                    needed) returned; unique_id_error its exception text
#   env_plugin, net_plugin  the file mapped after that call whose basename starts with
#                    libnccl-env / libnccl-net, or null
import ctypes
import json
import os
import struct
import sys

result = {
    "import_error": None,
    "torch_version": None,
    "torch_file": None,
    "python": sys.executable,
    "sys_path0": sys.path[0] if sys.path else None,
    "mapped_nccl": [],
    "libtorch_cuda": None,
    "calls_reach": {},
    "unbound": [],
    "nccl_versions": {},
    "unique_id_ok": False,
    "unique_id_error": None,
    "env_plugin": None,
    "net_plugin": None,
}


def maps():
    """(start, end, offset, path) of each file-backed mapping, in address order."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) < 6 or not parts[5].startswith("/"):
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            path = parts[5].rstrip("\n")
            if path.endswith(" (deleted)"):
                path = path[: -len(" (deleted)")]
            out.append((start, end, int(parts[2], 16), path))
    return out


def mapped_with_prefix(prefix):
    seen = []
    for _, _, _, path in maps():
        if os.path.basename(path).startswith(prefix) and path not in seen:
            seen.append(path)
    return seen


def file_at(address, regions):
    for start, end, _, path in regions:
        if start <= address < end:
            return path
    return None


class Elf:
    """The few parts of an ELF64 little-endian shared object the probe reads."""

    def __init__(self, path):
        self.f = open(path, "rb")
        ident = self.f.read(64)
        if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
            raise ValueError(path + " is not an ELF64 little-endian file")
        (_, _, _, _, self.phoff, self.shoff, _, _, self.phentsize, self.phnum,
         self.shentsize, self.shnum, self.shstrndx) = struct.unpack_from("<HHIQQQIHHHHHH", ident, 16)
        self.sections = []
        for i in range(self.shnum):
            self.f.seek(self.shoff + i * self.shentsize)
            (name, stype, flags, addr, offset, size, link, info, align, entsize) = struct.unpack(
                "<IIQQQQIIQQ", self.f.read(64))
            self.sections.append(dict(name=name, type=stype, addr=addr, offset=offset, size=size,
                                      link=link, entsize=entsize))
        if self.shstrndx < len(self.sections):
            names = self.read(self.sections[self.shstrndx])
            for s in self.sections:
                s["name"] = names[s["name"]:names.index(b"\0", s["name"])].decode()

    def read(self, section):
        self.f.seek(section["offset"])
        return self.f.read(section["size"])

    def program_headers(self):
        out = []
        for i in range(self.phnum):
            self.f.seek(self.phoff + i * self.phentsize)
            (ptype, flags, offset, vaddr, paddr, filesz, memsz, align) = struct.unpack(
                "<IIQQQQQQ", self.f.read(56))
            out.append(dict(type=ptype, offset=offset, vaddr=vaddr, align=align))
        return out


SHT_RELA, SHT_DYNSYM, SHN_UNDEF = 4, 11, 0
R_X86_64_64, R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT = 1, 6, 7
PAGE = os.sysconf("SC_PAGE_SIZE")


def calls_reach(lib, regions):
    elf = Elf(lib)
    # The load base: the first PT_LOAD is mapped at base + p_vaddr from file offset
    # p_offset, both rounded down to the page.
    first = min((p for p in elf.program_headers() if p["type"] == 1), key=lambda p: p["vaddr"])
    want = first["offset"] & ~(PAGE - 1)
    starts = [s for s, _, off, path in regions if path == lib and off == want]
    if not starts:
        raise ValueError("no mapping of %s at file offset %#x" % (lib, want))
    base = min(starts) - (first["vaddr"] & ~(PAGE - 1))
    plt = [(base + s["addr"], base + s["addr"] + s["size"])
           for s in elf.sections if s["name"] in (".plt", ".plt.sec", ".plt.got")]
    dynsym_index = next(i for i, s in enumerate(elf.sections) if s["type"] == SHT_DYNSYM)
    dynsym = elf.sections[dynsym_index]
    symtab = elf.read(dynsym)
    strtab = elf.read(elf.sections[dynsym["link"]])

    def symbol(index):
        name, info, other, shndx, value, size = struct.unpack_from("<IBBHQQ", symtab, index * 24)
        return strtab[name:strtab.index(b"\0", name)].decode(errors="replace"), shndx

    reach, unbound = {}, []
    for sec in elf.sections:
        if sec["type"] != SHT_RELA or sec["link"] != dynsym_index:
            continue
        for r_offset, r_info, r_addend in struct.iter_unpack("<QQq", elf.read(sec)):
            rtype, rsym = r_info & 0xFFFFFFFF, r_info >> 32
            if rtype not in (R_X86_64_64, R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT) or rsym == 0:
                continue
            name, shndx = symbol(rsym)
            if not name.startswith("nccl") or shndx != SHN_UNDEF:
                continue
            value = ctypes.c_uint64.from_address(base + r_offset).value
            target = file_at(value, regions)
            if value == 0 or target is None:
                unbound.append("%s: slot holds %#x, in no mapped file" % (name, value))
                continue
            if any(lo <= value < hi for lo, hi in plt):
                unbound.append("%s: slot points into %s's own PLT (not bound)" % (name, lib))
                continue
            if name in reach and reach[name] != target:
                unbound.append("%s: relocations disagree: %s and %s" % (name, reach[name], target))
                continue
            reach[name] = target
    return reach, unbound


try:
    import torch

    result["torch_version"] = torch.__version__
    result["torch_file"] = torch.__file__
except BaseException as e:  # an import that fails is part of the truth
    result["import_error"] = "%s: %s" % (type(e).__name__, e)

regions = maps()
result["mapped_nccl"] = mapped_with_prefix("libnccl.so")
cuda = [p for p in mapped_with_prefix("libtorch_cuda.so") if os.path.basename(p) == "libtorch_cuda.so"]
if cuda:
    result["libtorch_cuda"] = cuda[0]
    result["calls_reach"], result["unbound"] = calls_reach(cuda[0], regions)
for path in result["mapped_nccl"]:
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        v = ctypes.c_int(0)
        if lib.ncclGetVersion(ctypes.byref(v)) == 0:
            result["nccl_versions"][path] = v.value
    except (OSError, AttributeError):
        pass

if result["import_error"] is None:
    try:
        torch.cuda.nccl.unique_id()
        result["unique_id_ok"] = True
    except BaseException as e:
        result["unique_id_error"] = "%s: %s" % (type(e).__name__, e)

for key, prefix in (("env_plugin", "libnccl-env"), ("net_plugin", "libnccl-net")):
    found = mapped_with_prefix(prefix)
    result[key] = found[0] if found else None

with open(os.environ["FDL_PROBE_OUT"] + ".part", "w") as out:
    json.dump(result, out, indent=1)
os.rename(os.environ["FDL_PROBE_OUT"] + ".part", os.environ["FDL_PROBE_OUT"])

# FDL_PROBE_HOLD: stay alive, as the process seen from outside, until stdin closes (the
# answer is written to a temporary name first and renamed, so a reader never sees half).
if os.environ.get("FDL_PROBE_HOLD"):
    sys.stdin.read()
