//! Stand-ins for the native backend's tests: an NCCL source tree whose Makefile has
//! NCCL's targets and variables but compiles a small C++ library (with prepared GPU code,
//! or with a real kernel the toolkit's nvcc compiles), a CUDA_HOME whose `nvcc` answers
//! `--version` and `--list-gpu-arch` like the real one (and compiles nothing), and a
//! local git repository to clone from.
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// NCCL's top-level targets (`src.build`, `install`) and variables (`BUILDDIR`,
/// `PREFIX`, `CUDA_HOME`, `NVCC_GENCODE`, `ONLY_FUNCS`), its progress lines
/// (`Compiling`, `Linking`) and its install layout, headers included (`src/include/`:
/// the ones the real release of that version installs beside `nccl.h`). Like NCCL it asks the nvcc on PATH
/// for the CUDA release, which goes into the library's self-id. Everything it makes is
/// under BUILDDIR until `install` copies it to PREFIX. Its GPU code (`@GPU_CODE@`) is
/// [`GPU_PREPARED`] or [`GPU_NVCC`].
///
/// `FDL_TEST_STALL=<file>` makes the compile of init.cc touch that file and sleep
/// `FDL_TEST_STALL_SECS` (default 60) first, so a test can act while a build runs.
const MAKEFILE: &str = r#"include makefiles/version.mk

BUILDDIR ?= $(abspath build)
PREFIX ?= /usr/local
CUDA_HOME ?= /usr/local/cuda
NVCC_GENCODE ?= -gencode=arch=compute_90,code=sm_90
CUDA_VERSION := $(shell nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9]*\.[0-9]*\),.*/\1/p')
ifeq ($(CUDA_VERSION),)
CUDA_VERSION := 0.0
endif

OBJDIR := $(BUILDDIR)/obj
INCDIR := $(BUILDDIR)/include
LIBDIR := $(BUILDDIR)/lib
PKGDIR := $(LIBDIR)/pkgconfig
LIBTARGET := libnccl.so.$(NCCL_MAJOR).$(NCCL_MINOR).$(NCCL_PATCH)
LIBSONAME := libnccl.so.$(NCCL_MAJOR)

.PHONY: src.build install

src.build: $(LIBDIR)/$(LIBTARGET) $(LIBDIR)/libnccl_static.a $(INCDIR)/nccl.h $(PKGDIR)/nccl.pc

@GPU_CODE@
OBJS := $(OBJDIR)/init.o $(OBJDIR)/collectives.o $(OBJDIR)/buildinfo.o $(GPU_OBJS)

$(INCDIR)/nccl.h: src/nccl.h.in makefiles/version.mk
	@printf "Generating %-35s > %s\n" $< $@
	@mkdir -p $(INCDIR)
	sed -e 's/@MAJOR@/$(NCCL_MAJOR)/' -e 's/@MINOR@/$(NCCL_MINOR)/' -e 's/@PATCH@/$(NCCL_PATCH)/' $< > $@
	@if [ -d src/include ]; then cp -R src/include/. $(INCDIR)/; fi

$(OBJDIR)/buildinfo.cc: makefiles/version.mk
	@mkdir -p $(OBJDIR)
	@printf 'extern "C" const char ncclSelfId[] = "NCCL version %s.%s.%s+cuda%s";\n' $(NCCL_MAJOR) $(NCCL_MINOR) $(NCCL_PATCH) $(CUDA_VERSION) > $@
	@printf 'extern "C" const char fdlGencode[] = "gencode:%s";\n' "$(NVCC_GENCODE)" >> $@
	@printf 'extern "C" const char fdlOnlyFuncs[] = "only_funcs:%s";\n' "$(ONLY_FUNCS)" >> $@
	@printf 'extern "C" const char fdlMakeflags[] = "makeflags:%s";\n' "$(MAKEFLAGS)" >> $@

$(OBJDIR)/buildinfo.o: $(OBJDIR)/buildinfo.cc
	@printf "Compiling  %-35s > %s\n" buildinfo.cc $@
	$(CXX) -fPIC -O1 -c $< -o $@

$(OBJDIR)/%.o: src/%.cc
	@printf "Compiling  %-35s > %s\n" $< $@
	@mkdir -p $(OBJDIR)
	@if [ "$<" = src/init.cc ] && [ -n "$$FDL_TEST_STALL" ]; then touch "$$FDL_TEST_STALL"; sleep $${FDL_TEST_STALL_SECS:-60}; fi
	$(CXX) -fPIC -O1 -c $< -o $@

$(LIBDIR)/$(LIBTARGET): $(OBJS)
	@printf "Linking    %-35s > %s\n" $(LIBTARGET) $@
	@mkdir -p $(LIBDIR)
	$(CXX) -shared -fPIC -Wl,-soname,$(LIBSONAME) -o $@ $(OBJS) $(GPU_LIBS)
	ln -sf $(LIBTARGET) $(LIBDIR)/$(LIBSONAME)
	ln -sf $(LIBSONAME) $(LIBDIR)/libnccl.so

$(LIBDIR)/libnccl_static.a: $(OBJS)
	@printf "Archiving  %-35s > %s\n" libnccl_static.a $@
	@mkdir -p $(LIBDIR)
	ar cr $@ $(OBJS)

$(PKGDIR)/nccl.pc: src/nccl.pc.in makefiles/version.mk
	@mkdir -p $(PKGDIR)
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's/@VERSION@/$(NCCL_MAJOR).$(NCCL_MINOR).$(NCCL_PATCH)/' $< > $@

install: src.build
	mkdir -p $(PREFIX)/lib/pkgconfig $(PREFIX)/include
	cp -P $(LIBDIR)/libnccl.so $(LIBDIR)/$(LIBSONAME) $(LIBDIR)/$(LIBTARGET) $(LIBDIR)/libnccl_static.a $(PREFIX)/lib/
	cp $(PKGDIR)/nccl.pc $(PREFIX)/lib/pkgconfig/
	cp -R $(INCDIR)/. $(PREFIX)/include/
"#;

/// The stand-in's GPU code: SASS for each `code=sm_XX` of NVCC_GENCODE, as nvcc would
/// embed it: one prepared .nv_fatbin per arch (src/fatbin/sm_XX.c), compiled with cc.
const GPU_PREPARED: &str = r#"comma := ,
SASS := $(patsubst code=sm_%,%,$(filter code=sm_%,$(subst $(comma), ,$(NVCC_GENCODE))))
GPU_OBJS := $(patsubst %,$(OBJDIR)/fatbin_sm_%.o,$(SASS))
GPU_LIBS :=

$(OBJDIR)/fatbin_sm_%.o: src/fatbin/sm_%.c
	@printf "Compiling  %-35s > %s\n" $< $@
	@mkdir -p $(OBJDIR)
	$(CC) -fPIC -c $< -o $@
"#;

/// Real GPU code: a kernel (src/kernels.cu) the toolkit's nvcc compiles for
/// NVCC_GENCODE, linked with its static cudart as NCCL links it (CUDA_LIB, as NCCL's
/// makefiles name the library directory).
const GPU_NVCC: &str = r#"CUDA_LIB ?= $(CUDA_HOME)/lib64
GPU_OBJS := $(OBJDIR)/kernels.o
GPU_LIBS := -L$(CUDA_LIB) -lcudart_static -lpthread -ldl -lrt

$(OBJDIR)/kernels.o: src/kernels.cu
	@printf "Compiling  %-35s > %s\n" $< $@
	@mkdir -p $(OBJDIR)
	$(CUDA_HOME)/bin/nvcc $(NVCC_GENCODE) -Xcompiler -fPIC -O1 -c $< -o $@
"#;

const KERNELS_CU: &str = r#"// Device code for every arch of NVCC_GENCODE, so the library carries nvcc's own fatbin.
extern "C" __global__ void ncclStandinKernel(float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}
"#;

const NCCL_H_IN: &str = "#ifndef NCCL_H_\n#define NCCL_H_\n#define NCCL_MAJOR @MAJOR@\n#define NCCL_MINOR @MINOR@\n#define NCCL_PATCH @PATCH@\n#define NCCL_SUFFIX \"\"\nint ncclGetVersion(int *version);\n#endif\n";

const NCCL_PC_IN: &str = "prefix=@PREFIX@\nexec_prefix=${prefix}\nlibdir=${exec_prefix}/lib\nincludedir=${prefix}/include\n\nName: nccl\nDescription: Optimized primitives for collective multi-GPU communication\nVersion: @VERSION@\nLibs: -L${libdir} -lnccl\nCflags: -I${includedir}\n";

/// Writes the stand-in NCCL tree of `version` at `dir`, its GPU code prepared (no
/// toolkit needed).
pub fn standin_tree(dir: &Path, version: (u32, u32, u32)) {
    write_tree(dir, version, GPU_PREPARED);
    std::fs::create_dir_all(dir.join("src/fatbin")).unwrap();
    // Every arch of fdl's table, and archs newer than it (nvcc 13.5 brought sm_107).
    let newer = [107, 130];
    let archs = fdl::arch::ARCH_TABLE
        .iter()
        .map(|row| row.arch.number())
        .chain(newer);
    for n in archs {
        std::fs::write(
            dir.join(format!("src/fatbin/sm_{n}.c")),
            crate::common::fatbin_c_source(&[n], &format!("fdl_fatbin_sm_{n}")),
        )
        .unwrap();
    }
}

/// [`standin_tree`], defining every `nccl*` function the
/// torch library `torch_lib` imports (each returning 0), as a real NCCL exports them, so
/// that a preload of its build answers for all of torch's calls.
pub fn standin_tree_for(
    dir: &Path,
    version: (u32, u32, u32),
    torch_lib: &Path,
) -> Result<(), String> {
    let out = std::process::Command::new("nm")
        .args(["-D", "--undefined-only"])
        .arg(torch_lib)
        .output()
        .map_err(|e| format!("cannot run nm (binutils): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "nm cannot read {}: {}",
            torch_lib.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let mut source = String::new();
    for name in String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .map(|n| n.split('@').next().unwrap_or_default())
        .filter(|n| n.starts_with("nccl") && *n != "ncclGetVersion")
    {
        // A name from the library goes into C source: a plain identifier, or nothing.
        if name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            source.push_str(&format!("extern \"C\" int {name}() {{ return 0; }}\n"));
        }
    }
    if !source.contains("ncclAllReduce") {
        return Err(format!(
            "{} imports no ncclAllReduce: not a libtorch_cuda.so that links NCCL",
            torch_lib.display()
        ));
    }
    standin_tree(dir, version);
    std::fs::write(dir.join("src/collectives.cc"), source).map_err(|e| e.to_string())
}

/// Writes a stand-in NCCL tree of `version` at `dir` whose GPU code a real nvcc compiles
/// (`$(CUDA_HOME)/bin/nvcc $(NVCC_GENCODE)`): its library carries a real `.nv_fatbin`.
pub fn nvcc_tree(dir: &Path, version: (u32, u32, u32)) {
    write_tree(dir, version, GPU_NVCC);
    std::fs::write(dir.join("src/kernels.cu"), KERNELS_CU).unwrap();
}

fn write_tree(dir: &Path, version: (u32, u32, u32), gpu_code: &str) {
    let (x, y, z) = version;
    std::fs::create_dir_all(dir.join("makefiles")).unwrap();
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(
        dir.join("Makefile"),
        MAKEFILE.replace("@GPU_CODE@", gpu_code),
    )
    .unwrap();
    std::fs::write(
        dir.join("makefiles/version.mk"),
        format!("##### version\nNCCL_MAJOR   := {x}\nNCCL_MINOR   := {y}\nNCCL_PATCH   := {z}\nNCCL_SUFFIX  :=\nPKG_REVISION := 1\n"),
    )
    .unwrap();
    std::fs::write(dir.join("src/nccl.h.in"), NCCL_H_IN).unwrap();
    // The other headers this version installs (from 2.28 on, nccl_device.h beside
    // nccl_device/), copied into the build's include/ as NCCL's makefiles do.
    crate::common::write_nccl_headers(&dir.join("src/include"), version);
    std::fs::write(dir.join("src/nccl.pc.in"), NCCL_PC_IN).unwrap();
    std::fs::write(
        dir.join("src/init.cc"),
        format!(
            "extern \"C\" __attribute__((visibility(\"default\"))) int ncclGetVersion(int *v) {{ *v = {}; return 0; }}\n",
            x * 10000 + y * 100 + z
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("src/collectives.cc"),
        "extern \"C\" int ncclAllReduce() { return 0; }\n",
    )
    .unwrap();
}

/// A CUDA_HOME at `home` (with `lib_dir`, `lib64` or `lib`, and the headers, cudart and
/// cicc the plan checks for, empty) whose `bin/nvcc` reports
/// `release` (e.g. "12.8", "V12.8.93") and lists `archs` (e.g. `[75, 86, 90]`).
pub fn fake_cuda_home(home: &Path, release: &str, full: &str, archs: &[u32], lib_dir: &str) {
    std::fs::create_dir_all(home.join("bin")).unwrap();
    std::fs::create_dir_all(home.join(lib_dir)).unwrap();
    // The files the plan checks a compile needs (empty: this nvcc compiles nothing).
    for file in [
        "include/cuda_runtime.h",
        "include/cuda.h",
        "include/crt/host_config.h",
        "nvvm/bin/cicc",
    ] {
        std::fs::create_dir_all(home.join(file).parent().unwrap()).unwrap();
        std::fs::write(home.join(file), "").unwrap();
    }
    std::fs::write(home.join(lib_dir).join("libcudart_static.a"), "").unwrap();
    let list: String = archs.iter().map(|a| format!("compute_{a}\\n")).collect();
    // Shell builtins only, so it answers under any PATH.
    let script = format!(
        "#!/bin/sh\n# Stand-in nvcc: answers the questions fdl asks, compiles nothing.\ncase \"$1\" in\n  --version) printf 'nvcc: NVIDIA (R) Cuda compiler driver\\nCopyright (c) 2005-2025 NVIDIA Corporation\\nBuilt on Fri_Feb_21_20:23:50_PST_2025\\nCuda compilation tools, release {release}, {full}\\nBuild cuda_{release}.r{release}/compiler.35583870_0\\n' ;;\n  --list-gpu-arch) printf '{list}' ;;\n  *) echo \"stand-in nvcc: cannot compile ($*)\" >&2; exit 1 ;;\nesac\n"
    );
    let nvcc = home.join("bin/nvcc");
    std::fs::write(&nvcc, script).unwrap();
    std::fs::set_permissions(&nvcc, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The usual stand-in toolkit: CUDA 12.8.93 offering sm_75 … sm_120.
pub fn cuda_12_8(home: &Path) {
    fake_cuda_home(
        home,
        "12.8",
        "V12.8.93",
        &[75, 80, 86, 87, 89, 90, 100, 120],
        "lib64",
    );
}

pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=fdl test",
            "-c",
            "user.email=test@fdl.invalid",
        ])
        .args(args)
        .output()
        .expect("git is needed for these tests");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A git repository at `dir` holding the stand-in tree of `version`, tagged `tag`.
pub fn tagged_repo(dir: &Path, version: (u32, u32, u32), tag: &str) -> PathBuf {
    standin_tree(dir, version);
    git(dir, &["init", "-q"]);
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "stand-in NCCL"]);
    git(dir, &["tag", tag]);
    dir.to_path_buf()
}

/// Where `name` is on this machine's PATH.
pub fn host_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// A directory of symlinks to the host's `tools`: a PATH offering exactly those.
pub fn path_of_only(tools: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for t in tools {
        let real = host_tool(t).unwrap_or_else(|| panic!("{t} is needed for these tests"));
        std::os::unix::fs::symlink(real, dir.path().join(t)).unwrap();
    }
    dir
}
