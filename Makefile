# rockmate -- build, test, install. See README.md.
#
#   make              libraries (static + shared), the CLI and the examples
#   make lib          the library only
#   make test         build everything, run the suite (tests/run.sh)
#   make amalgamation write rockmate.c from src/ (src/amalgamate.sh); the
#                     build refuses a rockmate.c that differs from it
#   make demo         build and run the demo
#   make demo-pipeline  the GPT-2 trainer as a 4-stage pipeline over MPI
#                     (examples/gpt2_pipe.c; Open MPI from Debian, installed
#                     when root, else the command printed)
#   make llmc LLMC=path   build examples/llmc.c against an llm.c checkout and run
#                     it (llm.c's own kernels under rockmate plans, checked bit
#                     for bit against llm.c's gpt2_forward/backward); without
#                     LLMC= it says so and does nothing
#   make cuda         CUDA sources (needs nvcc)
#   make bench        build and run the benchmarks
#   make fuzz         libFuzzer on each harness for FUZZ_SECONDS (default 60; clang)
#   make valgrind     the whole-library tests under valgrind (minutes)
#   make coverage     the C test programs built with gcc's --coverage (-O0, no
#                     sanitizers) in COV_BUILD (default build-cov), run, then
#                     gcov's line and branch coverage of src/*.c, per file and
#                     in total (tests/coverage.py); COV_TESTS="test_dp
#                     test_graph" runs only those programs
#   make install      PREFIX=/usr/local DESTDIR=
#   make OMIT=1 ...   no lp_solve: -DRKM_OMIT_SOLVER, no LGPL code linked
#   make CC=clang ... any C11 compiler

BUILD ?= build
PREFIX ?= /usr/local
LIBDIR ?= $(PREFIX)/lib
OMIT ?= 0

# -ffp-contract=off: no fused multiply-add behind our back, so that plans
# (which depend on float sums of costs) are the same on every machine.
STD_FLAGS = -std=c11 -Wall -Wextra -Wpedantic -ffp-contract=off
CFLAGS ?= -O2 -g
ALL_CFLAGS = $(STD_FLAGS) $(CFLAGS) -I.
# make coverage sets TEST_OPT and TEST_SAN for its own build.
TEST_OPT = -O1
TEST_SAN = -fsanitize=address,undefined -fno-sanitize-recover=all
TEST_CFLAGS = $(STD_FLAGS) -I. -Werror $(TEST_OPT) -g -fno-omit-frame-pointer $(TEST_SAN) \
	-DTEST_GRAPHS_DIR=\"tests/graphs\"

ifeq ($(OMIT),1)
DEFS = -DRKM_OMIT_SOLVER
SOLVER_LIBS =
SO_SOLVER_LIBS =
DEP_PKGS =
else
DEFS =
SOLVER_LIBS = -llpsolve55 -lcolamd -ldl
# The shared library takes lp_solve's position-independent archive.
SO_SOLVER_LIBS = $(shell $(CC) -print-file-name=liblpsolve55_pic.a) -lcolamd -ldl
# liblpsolve55-dev: <lpsolve/lp_lib.h>, liblpsolve55.a and _pic.a;
# libsuitesparse-dev: libcolamd (liblpsolve55-dev depends on it too).
DEP_PKGS = liblpsolve55-dev libsuitesparse-dev
DEP_HEADERS = lpsolve/lp_lib.h
DEP_LIBS = liblpsolve55.a liblpsolve55_pic.a libcolamd.so
endif
LDLIBS = $(SOLVER_LIBS) -lm -pthread
# A fully static link also needs what libcolamd needs.
STATIC_LIBS = $(SOLVER_LIBS) $(if $(SOLVER_LIBS),-lsuitesparseconfig) -lm -pthread

VERSION := $(shell sed -n 's/^\#define RKM_VERSION_STRING "\(.*\)"/\1/p' rockmate.h)

LIB_A = $(BUILD)/librockmate.a
# The shared library carries a versioned soname (ABI major = the version's
# major): librockmate.so.0 -> librockmate.so.0.7.0, and librockmate.so for
# the linker.
SO_MAJOR = $(firstword $(subst ., ,$(VERSION)))
LIB_SO = $(BUILD)/librockmate.so.$(VERSION)
LIB_OBJ = $(BUILD)/rockmate.o
TEST_LIB = $(BUILD)/tests/librockmate.a

CLI_SRCS = $(wildcard cli/*.c)
CLI_BIN = $(BUILD)/rockmate

# Every examples/*.c with a main() is one program build/NAME, but for
# examples/llmc.c, which needs an llm.c checkout (make llmc LLMC=path), and
# examples/gpt2_pipe.c, which needs MPI (below).
EXAMPLE_SRCS := $(filter-out examples/llmc.c examples/gpt2_pipe.c,\
	$(shell grep -lE '^[[:space:]]*int[[:space:]]+main\b' examples/*.c 2>/dev/null))
EXAMPLES = $(patsubst examples/%.c,$(BUILD)/%,$(EXAMPLE_SRCS))

# The pipeline trainer (examples/gpt2_pipe.c): MPI ranks, built with mpicc
# around $(CC) where mpicc is found (Debian: libopenmpi-dev openmpi-bin,
# which make test and make demo-pipeline install when root), skipped with a
# message where not. As root mpirun wants --allow-run-as-root; more ranks
# than cores want --oversubscribe, and ranks that wait yield the core
# (mpi_yield_when_idle) instead of spinning against the ranks that compute.
MPICC ?= $(shell command -v mpicc 2>/dev/null)
MPI_PKGS = libopenmpi-dev openmpi-bin
MISSING_MPI = $(strip $(if $(shell command -v mpicc 2>/dev/null),,mpicc) $(if $(shell command -v mpirun 2>/dev/null),,mpirun))
PIPE_BIN = $(BUILD)/gpt2_pipe
MPIRUN_FLAGS = $(if $(filter 0,$(shell id -u)),--allow-run-as-root) --oversubscribe --mca mpi_yield_when_idle 1
# The demo: P = 4 stages, M = 8 micro-batches, 1F1B, dropout on.
DEMO_PIPE = -np 4 $(PIPE_BIN) --micro-batches 8 --layers 8 --channels 128 --steps 4 --dropout 0.1 --budget 50%

TEST_SRCS = $(wildcard tests/test_*.c)
TESTS = $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRCS))
# The whole-library tests again under clang's sanitizers, which catch what
# gcc's miss (pointer arithmetic on NULL); skipped when clang is not there.
CLANG ?= $(shell command -v clang 2>/dev/null)
CLANG_TEST_NAMES = test_dp test_exec test_graph test_oom test_sim
CLANG_TESTS = $(if $(CLANG),$(patsubst %,$(BUILD)/tests/%-clang,$(CLANG_TEST_NAMES)))
# The threads test again under ThreadSanitizer, the library compiled with it.
TSAN_TESTS = $(BUILD)/tests/test_threads-tsan
# Fuzz harnesses (tests/fuzz): `make test` replays each one's corpus under
# the sanitizers (deterministic, no mutation; FUZZ_REPLAY: a harness may
# make its costliest checks on a share of the corpus); `make fuzz` runs libFuzzer
# (clang) on each for FUZZ_SECONDS, adding what it finds to the corpus.
FUZZERS = graph plan planner
FUZZ_REPLAYS = $(patsubst %,$(BUILD)/tests/test_fuzz_%,$(FUZZERS))
FUZZ_SECONDS ?= 60

BENCH_SRCS = $(wildcard bench/*.c)
BENCHES = $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRCS))

# The demo: the GPT-2 trainer (the program first, then its arguments).
DEMO = $(BUILD)/gpt2 --budget 40%

# CUDA: nvcc from PATH, else the toolkit's default place.
# -fmad=false: no fused multiply-add in the kernels (as -ffp-contract=off in
# C): `g += x * s` as one FMA makes the sum of a gradient's contributions
# depend on their order, hence on the plan (examples/gpt2_cuda.cu says
# more). -lineinfo: source lines in compute-sanitizer's reports.
NVCC ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc))
# CUDA_CFLAGS, CUDA_LDFLAGS: where cuBLAS is when nvcc does not look there
# (tests/gpu/run.sh sets them, -I, -L and an rpath, for a cuBLAS that came
# with a Python wheel).
CUDA_CFLAGS ?=
NVCC_COMMON = -O2 -g -std=c++17 -fmad=false -lineinfo -Xcompiler -Wall,-Wextra -I. $(CUDA_CFLAGS) $(DEFS)
NVCC_FLAGS = $(NVCC_COMMON) -gencode 'arch=compute_90,code=[sm_90,compute_90]'
CUDA_LDFLAGS ?=
CUDA_LIBS ?= -lcublas -lcublasLt
# The device-free half (the arena) is in the library, tested on the CPU.
CUDA_SRCS = $(wildcard cuda/*.cu)
CUDA_OBJS = $(patsubst cuda/%.cu,$(BUILD)/cuda/%.o,$(CUDA_SRCS))
CUDA_EXAMPLE_SRCS = $(wildcard examples/*.cu)
CUDA_EXAMPLES = $(patsubst examples/%.cu,$(BUILD)/%,$(CUDA_EXAMPLE_SRCS))
# The examples' PTX (for compute_90), which tests/test_cuda_dummy.sh reads:
# the kernels that sum gradients must hold no fma.
CUDA_PTX = $(patsubst examples/%.cu,$(BUILD)/cuda/%.ptx,$(CUDA_EXAMPLE_SRCS))

# The CUDA trainer's stage mode (examples/gpt2_cuda_pipe.cuh, compiled into
# gpt2_cuda.cu by -DGPT2_CUDA_MPI): one MPI rank per pipeline stage, built
# where mpicxx is found (its flags from Open MPI's --showme), skipped with a
# message where not. With nvcc: $(BUILD)/gpt2_cuda_mpi (make cuda), moving
# the boundary tensors with NCCL (-DGPT2_HAVE_NCCL) when nccl.h is in nvcc's
# toolkit (or NCCL_HOME), through pinned host memory over MPI otherwise; on
# the dummy device, which has no NCCL: $(BUILD)/tests/gpt2_cuda_pipe_dummy
# (mpicxx around $(CXX)), run by tests/test_cuda_pipe_dummy.sh.
MPICXX ?= $(shell command -v mpicxx 2>/dev/null)
MPI_CXX_CFLAGS = $(filter -I%,$(shell $(MPICXX) --showme:compile 2>/dev/null))
MPI_CXX_LIBS = $(filter -L% -l%,$(shell $(MPICXX) --showme:link 2>/dev/null))
CUDA_MPI_BIN = $(BUILD)/gpt2_cuda_mpi
NCCL_H = $(if $(NVCC),$(firstword $(wildcard $(dir $(NVCC))../include/nccl.h $(if $(NCCL_HOME),$(NCCL_HOME)/include/nccl.h))))
NCCL_FLAGS = $(if $(NCCL_H),-DGPT2_HAVE_NCCL $(if $(NCCL_HOME),-I$(NCCL_HOME)/include))
NCCL_LIBS = $(if $(NCCL_H),$(if $(NCCL_HOME),-L$(NCCL_HOME)/lib) -lnccl)
CUDA_PIPE_DUMMY = $(if $(and $(CXX_FOUND),$(MPICXX)),$(BUILD)/tests/gpt2_cuda_pipe_dummy)

# The dummy device (tests/dummy): the CUDA runtime and cuBLAS calls of cuda/
# and examples/gpt2_cuda.cu on the CPU, so that their host code and kernels
# build with g++ and run here, sanitized, without a GPU or nvcc. A .cu file
# becomes C++ by a sed that spells each launch k<<<...>>>( as
# RKM_DUMMY_LAUNCH(k, ...)( (line for line: diagnostics keep their lines).
# The dummy's own file is -O2 (its GEMMs dominate the runs' time).
CXX_FOUND := $(shell command -v $(CXX) 2>/dev/null)
DUMMY_CXXFLAGS = -std=c++17 -Wall -Wextra -Wpedantic -ffp-contract=off -I. -Itests/dummy -Werror -g \
	-fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all $(DEFS)
DUMMY_DIR = $(BUILD)/tests/dummy
DUMMY_OBJS = $(DUMMY_DIR)/dummy.o $(DUMMY_DIR)/rockmate_cuda.o
DUMMY_LAUNCH_SED = sed -E 's/([A-Za-z_][A-Za-z0-9_]*)<<<(.*)>>>\(/RKM_DUMMY_LAUNCH(\1, \2)(/'
# build/tests/test_cuda (run by tests/run.sh) and the CUDA trainer on the
# dummy device (run by tests/test_cuda_dummy.sh).
DUMMY_TESTS = $(if $(CXX_FOUND),$(BUILD)/tests/test_cuda $(BUILD)/tests/gpt2_cuda_dummy)

.PHONY: all lib cli examples tests test amalgamation check-amalgamation demo demo-pipeline llmc cuda bench fuzz \
	valgrind coverage install uninstall clean deps test-deps mpi-deps FORCE
.DELETE_ON_ERROR:

all: lib cli examples

lib: $(LIB_A) $(LIB_SO)

cli: $(CLI_BIN)

examples: $(EXAMPLES) $(if $(MPICC),$(PIPE_BIN))
	@$(if $(MPICC),:,echo "examples: mpicc not found, skipping $(PIPE_BIN) (Debian: $(MPI_PKGS))")

tests: $(TESTS) $(CLANG_TESTS) $(TSAN_TESTS) $(FUZZ_REPLAYS) $(DUMMY_TESTS) $(CUDA_PIPE_DUMMY)
	@$(if $(CLANG),:,echo "tests: clang not found, skipping the clang sanitizer builds")
	@$(if $(CXX_FOUND),:,echo "tests: $(CXX) not found, skipping the dummy CUDA device")
	@$(if $(CUDA_PIPE_DUMMY),:,echo "tests: $(CXX) or mpicxx not found, skipping the CUDA stage mode on the dummy device")

# rockmate.c is generated from src/ and committed, so that users vendor two
# files. Nothing writes it behind a developer's back: where src/ is newer,
# the build checks that rockmate.c is what src/ makes and, if not, says to
# run make amalgamation; make test checks it whatever the times say.
SRC_FILES = src/internal.h $(wildcard src/*.c) src/amalgamate.sh

amalgamation:
	sh src/amalgamate.sh

# Also: each source file builds on its own through internal.h (so that the
# private header is the whole interface between files), none is over 1,500
# lines.
check-amalgamation: | deps
	@sh src/amalgamate.sh --check
	@for f in $(filter %.c,$(SRC_FILES)); do \
	  $(CC) $(STD_FLAGS) -Werror -I. $(DEFS) -fsyntax-only $$f || exit 1; \
	  n=$$(wc -l <$$f); [ $$n -le 1500 ] || { echo "$$f: $$n lines, over 1500: split it"; exit 1; }; \
	done

rockmate.c: $(SRC_FILES)
	@sh src/amalgamate.sh --check
	@touch $@

# The build, on every core: a sub-make with its own -j, so that a plain
# `make test` (the README's command, CI's) does not compile the ~20
# sanitized copies of the library one by one. The tests then run from this
# make, whose scripts call make without a jobserver.
NPROC = $(shell nproc 2>/dev/null || echo 1)

test: check-amalgamation | test-deps
	@$(MAKE) --no-print-directory -j$(NPROC) lib cli examples tests $(if $(NVCC),cuda)
	@$(if $(NVCC),:,echo "test: nvcc not found, skipping the CUDA sources")
	RKM_BUILD=$(BUILD) tests/run.sh $(BUILD)

demo: $(firstword $(DEMO))
	$(DEMO)

# A sub-make builds it: mpicc may have just been installed.
demo-pipeline: | mpi-deps
	@$(MAKE) --no-print-directory $(PIPE_BIN)
	mpirun $(MPIRUN_FLAGS) $(DEMO_PIPE)

# llm.c's train_gpt2.c comes in through -isystem: its own code is not held
# to our warning flags. No -Ofast: fast-math may reassociate the sums of a
# kernel inlined into two callers differently, and the check is bit for bit.
LLMC ?=
LLMC_ARGS ?=
ifeq ($(strip $(LLMC)),)
llmc:
	@echo "llmc: skipped: no llm.c checkout given (make llmc LLMC=path/to/llm.c)"
else
llmc: $(BUILD)/llmc
	$(BUILD)/llmc $(LLMC_ARGS)

$(BUILD)/llmc: examples/llmc.c examples/llmc_graph.h examples/llmc_host.h rockmate.h $(LIB_A) \
		$(LLMC)/train_gpt2.c FORCE
	$(CC) $(ALL_CFLAGS) $(DEFS) -isystem $(LLMC) -o $@ $< $(LIB_A) $(LDLIBS)
endif

bench: $(BENCHES)
	@for b in $(BENCHES); do echo "== $$b"; $$b || exit 1; done

# Check the Debian packages; install them when root, else say how.
# Cheap when all is there: a few compiler look-ups, no package manager.
MISSING_DEPS = $(strip \
	$(foreach f,$(DEP_LIBS),$(if $(filter /%,$(shell $(CC) -print-file-name=$f)),,$f)) \
	$(foreach h,$(DEP_HEADERS),$(if $(shell printf '\#include <%s>\n' $h | $(CC) -E -x c - >/dev/null 2>&1 && echo ok),,<$h>)))
# Tools the test scripts call (test_cli.sh checks JSON with python3,
# test_install.sh links through pkg-config); Debian packages of those names.
TEST_TOOLS = $(if $(shell grep -ls python3 tests/*.sh 2>/dev/null),python3) \
	$(if $(shell grep -ls pkg-config tests/*.sh 2>/dev/null),pkg-config)
MISSING_TOOLS = $(strip $(foreach t,$(TEST_TOOLS),$(if $(shell command -v $t 2>/dev/null),,$t)))

# $(call install_or_tell,MISSING,PACKAGES)
install_or_tell = if [ -n "$1" ]; then \
	  echo "missing: $1 (Debian packages: $2)"; \
	  if [ "$$(id -u)" = 0 ]; then \
	    DEBIAN_FRONTEND=noninteractive apt-get update && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y $2 || exit 1; \
	  else \
	    echo "run: sudo apt-get update && sudo apt-get install -y $2"; exit 1; \
	  fi; \
	fi

deps:
	@$(call install_or_tell,$(MISSING_DEPS),$(DEP_PKGS))

test-deps:
	@$(call install_or_tell,$(MISSING_TOOLS),$(TEST_TOOLS))
	@if [ -n "$(MISSING_MPI)" ] && [ "$$(id -u)" != 0 ]; then \
	  echo "missing: $(MISSING_MPI): the pipeline tests will skip (run: sudo apt-get update && sudo apt-get install -y $(MPI_PKGS))"; \
	else $(call install_or_tell,$(MISSING_MPI),$(MPI_PKGS)); fi

mpi-deps:
	@$(call install_or_tell,$(MISSING_MPI),$(MPI_PKGS))

# Rebuild when the compiler or the flags change (CC=clang, OMIT=1, the
# tests' TEST_OPT and TEST_SAN).
FLAGS_LINE = $(CC) $(ALL_CFLAGS) $(DEFS) $(TEST_OPT) $(TEST_SAN)
$(BUILD)/flags: FORCE
	@mkdir -p $(BUILD)
	@echo '$(FLAGS_LINE)' | cmp -s - $@ || echo '$(FLAGS_LINE)' > $@

# One position-independent object serves both libraries.
$(LIB_OBJ): rockmate.c rockmate.h $(BUILD)/flags | deps
	$(CC) $(ALL_CFLAGS) $(DEFS) -fPIC -c -o $@ rockmate.c

$(LIB_A): $(LIB_OBJ)
	rm -f $@
	ar rcs $@ $^

# lp_solve goes inside the .so; --exclude-libs keeps its symbols private so
# that a host linking its own lp_solve does not clash with ours.
$(LIB_SO): $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,librockmate.so.$(SO_MAJOR) -Wl,-z,defs -Wl,--exclude-libs,ALL \
		-o $@ $^ $(SO_SOLVER_LIBS) -lm -pthread
	ln -sf librockmate.so.$(VERSION) $(BUILD)/librockmate.so.$(SO_MAJOR)
	ln -sf librockmate.so.$(VERSION) $(BUILD)/librockmate.so

$(BUILD)/rockmate: $(CLI_SRCS) $(wildcard cli/*.h) rockmate.h $(LIB_A)
	$(CC) $(ALL_CFLAGS) $(DEFS) -o $@ $(CLI_SRCS) $(LIB_A) $(LDLIBS)

$(EXAMPLES): $(BUILD)/%: examples/%.c $(wildcard examples/*.h) rockmate.h $(LIB_A)
	$(CC) $(ALL_CFLAGS) $(DEFS) -o $@ $< $(LIB_A) $(LDLIBS)

# mpicc compiles with $(CC) (OMPI_CC: Open MPI's wrapper; MPICH_CC: MPICH's).
$(PIPE_BIN): examples/gpt2_pipe.c $(wildcard examples/*.h) rockmate.h $(LIB_A)
	@$(if $(MPICC),:,echo "$@: mpicc not found (Debian: $(MPI_PKGS); make mpi-deps)"; exit 1)
	OMPI_CC=$(CC) MPICH_CC=$(CC) $(MPICC) $(ALL_CFLAGS) $(DEFS) -o $@ $< $(LIB_A) $(LDLIBS)

$(BENCHES): $(BUILD)/bench/%: bench/%.c $(wildcard bench/*.h) rockmate.h $(LIB_A)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(DEFS) -o $@ $< $(LIB_A) $(LDLIBS)

# Tests are sanitized programs. One that includes ../rockmate.c is whole
# (it reaches what a source file keeps to itself); one that includes
# ../src/internal.h links the sources' objects, compiled once (the private
# functions are extern there), instead of compiling the library again (~30 s
# of a sanitized build apiece), and includes the few src/*.c whose statics it
# calls (their objects are then not linked: each symbol is defined once);
# the others link the sanitized library.
INCLUDES_LIB = grep -qE '^[[:space:]]*\#[[:space:]]*include[[:space:]]+"\.\./rockmate\.c"'
INCLUDES_SRC = grep -qE '^[[:space:]]*\#[[:space:]]*include[[:space:]]+"\.\./src/internal\.h"'
TEST_SRC_OBJS = $(patsubst src/%.c,$(BUILD)/tests/src/%.o,$(wildcard src/*.c))
CLANG_SRC_OBJS = $(patsubst src/%.c,$(BUILD)/tests/src-clang/%.o,$(wildcard src/*.c))
TEST_SRC_LIB = $(BUILD)/tests/librockmate-src.a
CLANG_SRC_LIB = $(BUILD)/tests/librockmate-src-clang.a
# what test $< links: nothing, the sources' objects, or the library
TEST_LINKS = $$($(INCLUDES_LIB) $< || { $(INCLUDES_SRC) $< && echo $(TEST_SRC_LIB); } || echo $(TEST_LIB))

$(TEST_SRC_LIB): $(TEST_SRC_OBJS)
	rm -f $@
	ar rcs $@ $^

$(CLANG_SRC_LIB): $(CLANG_SRC_OBJS)
	rm -f $@
	ar rcs $@ $^

$(BUILD)/tests/src/%.o: src/%.c src/internal.h rockmate.h $(BUILD)/flags | deps
	@mkdir -p $(@D)
	$(CC) $(TEST_CFLAGS) $(DEFS) -c -o $@ $<

$(BUILD)/tests/src-clang/%.o: src/%.c src/internal.h rockmate.h $(BUILD)/flags | deps
	@mkdir -p $(@D)
	$(CLANG) $(TEST_CFLAGS) $(DEFS) -c -o $@ $<

$(BUILD)/tests/rockmate.o: rockmate.c rockmate.h $(BUILD)/flags | deps
	@mkdir -p $(@D)
	$(CC) $(TEST_CFLAGS) $(DEFS) -c -o $@ rockmate.c

$(TEST_LIB): $(BUILD)/tests/rockmate.o
	rm -f $@
	ar rcs $@ $^

$(CLANG_TESTS): $(BUILD)/tests/%-clang: tests/%.c $(wildcard tests/*.h examples/*.h) rockmate.c rockmate.h $(BUILD)/flags \
		$(CLANG_SRC_LIB)
	@mkdir -p $(@D)
	$(CLANG) $(TEST_CFLAGS) $(DEFS) -o $@ $< $$($(INCLUDES_SRC) $< && echo $(CLANG_SRC_LIB)) $(LDLIBS)

$(TSAN_TESTS): $(BUILD)/tests/%-tsan: tests/%.c $(wildcard tests/*.h examples/*.h) rockmate.c rockmate.h $(BUILD)/flags
	@mkdir -p $(@D)
	$(CC) $(STD_FLAGS) -I. -Werror -O1 -g -fsanitize=thread -DTEST_GRAPHS_DIR=\"tests/graphs\" $(DEFS) \
		-o $@ $< rockmate.c $(LDLIBS)

# The harnesses use the public API only: linked with the sanitized library
# (compiling rockmate.c into each would add ~10 s of build apiece).
$(FUZZ_REPLAYS): $(BUILD)/tests/test_fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c tests/fuzz/fuzz.h tests/test.h rockmate.h \
		$(TEST_LIB) $(BUILD)/flags
	@mkdir -p $(@D)
	$(CC) $(TEST_CFLAGS) $(DEFS) -DFUZZ_REPLAY -DFUZZ_NAME=\"$*\" -o $@ $< tests/fuzz/replay.c $(TEST_LIB) $(LDLIBS)

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz.h tests/test.h rockmate.c rockmate.h $(BUILD)/flags
	@mkdir -p $(@D)
	$(CLANG) $(STD_FLAGS) -I. -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all $(DEFS) \
		-o $@ $< rockmate.c $(LDLIBS)

# The whole-library tests, unsanitized, under valgrind (lp_solve's own
# uninitialised reads suppressed: tests/valgrind.supp). Slow: minutes. A test
# on the sources gets those it does not include itself.
VALGRIND_TESTS = test_dp test_exec test_graph test_ilp test_oom test_sim
valgrind: | deps
	@command -v valgrind >/dev/null || { echo "valgrind: not found (apt-get install -y valgrind)"; exit 1; }
	@mkdir -p $(BUILD)/valgrind
	@for t in $(VALGRIND_TESTS); do \
	  $(CC) $(STD_FLAGS) -I. -O1 -g -DTEST_GRAPHS_DIR=\"tests/graphs\" $(DEFS) -o $(BUILD)/valgrind/$$t tests/$$t.c \
	    $$($(INCLUDES_SRC) tests/$$t.c && for f in src/*.c; do grep -qF "\"../$$f\"" tests/$$t.c || echo $$f; done) \
	    $(LDLIBS) || exit 1; \
	  echo "== valgrind $$t"; \
	  valgrind -q --error-exitcode=9 --leak-check=full --suppressions=tests/valgrind.supp $(BUILD)/valgrind/$$t || exit 1; \
	done

# Coverage: the test programs and the fuzz corpora's replays, unsanitized at
# -O0 (the sanitizers only slow it; -O0 keeps lines and branches as
# written), counters updated atomically (test_threads). Each run starts from
# zero counts; a failing test fails the target after the report. A program
# killed by the time limit leaves no counts: the limit is an hour here
# (test_fuzz_planner took over 600 s on 2 busy cores).
COV_BUILD ?= build-cov
COV_TESTS ?=
COV_PROGS = $(or $(COV_TESTS),$(notdir $(TESTS) $(FUZZ_REPLAYS)))
coverage: check-amalgamation | test-deps
	@$(MAKE) --no-print-directory -j$(NPROC) BUILD=$(COV_BUILD) TEST_SAN= \
		'TEST_OPT=-O0 --coverage -fprofile-update=atomic' $(addprefix $(COV_BUILD)/tests/,$(COV_PROGS))
	@find $(COV_BUILD) -name '*.gcda' -delete
	@RKM_BUILD=$(COV_BUILD) RKM_TEST_TIMEOUT=$${RKM_TEST_TIMEOUT:-3600} \
	  tests/run.sh $(COV_BUILD) $(COV_PROGS); rc=$$?; \
	  python3 tests/coverage.py $(COV_BUILD) || rc=1; exit $$rc

ifeq ($(CLANG),)
fuzz:
	@echo "fuzz: clang not found (apt-get install -y clang); libFuzzer comes with it"
else
fuzz: $(patsubst %,$(BUILD)/fuzz/fuzz_%,$(FUZZERS))
	@for f in $(FUZZERS); do echo "== fuzz_$$f for $(FUZZ_SECONDS) s"; \
	  $(BUILD)/fuzz/fuzz_$$f -max_total_time=$(FUZZ_SECONDS) -max_len=65536 tests/fuzz/corpus/$$f || exit 1; done
endif

$(TESTS): $(BUILD)/tests/%: tests/%.c $(wildcard tests/*.h examples/*.h) rockmate.c rockmate.h $(TEST_LIB) \
		$(TEST_SRC_LIB)
	$(CC) $(TEST_CFLAGS) $(DEFS) -o $@ $< $(TEST_LINKS) $(LDLIBS)

ifeq ($(NVCC),)
cuda:
	@echo "cuda: nvcc not found, skipping the CUDA sources"
else
cuda: $(CUDA_OBJS) $(CUDA_EXAMPLES) $(CUDA_PTX) $(if $(MPICXX),$(CUDA_MPI_BIN))
	@$(if $(MPICXX),:,echo "cuda: mpicxx not found, skipping $(CUDA_MPI_BIN) (Debian: $(MPI_PKGS))")
	@$(if $(MPICXX),$(if $(NCCL_H),:,echo "cuda: nccl.h not found by nvcc's toolkit (or NCCL_HOME): $(CUDA_MPI_BIN) moves tensors through host memory over MPI"))
endif

$(BUILD)/cuda/%.o: cuda/%.cu $(wildcard cuda/*.h cuda/*.cuh) rockmate.h $(BUILD)/flags
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_FLAGS) -c -o $@ $<

$(CUDA_EXAMPLES): $(BUILD)/%: examples/%.cu $(CUDA_OBJS) $(wildcard examples/*.h examples/*.cuh) rockmate.h $(LIB_A)
	$(NVCC) $(NVCC_FLAGS) -o $@ $< $(CUDA_OBJS) $(LIB_A) $(SOLVER_LIBS) -lm -lpthread $(CUDA_LDFLAGS) $(CUDA_LIBS)

$(CUDA_MPI_BIN): examples/gpt2_cuda.cu $(CUDA_OBJS) $(wildcard examples/*.h examples/*.cuh) rockmate.h $(LIB_A)
	$(NVCC) $(NVCC_FLAGS) -DGPT2_CUDA_MPI -DOMPI_SKIP_MPICXX $(NCCL_FLAGS) $(MPI_CXX_CFLAGS) -o $@ $< $(CUDA_OBJS) \
		$(LIB_A) $(SOLVER_LIBS) -lm -lpthread $(CUDA_LDFLAGS) $(CUDA_LIBS) $(NCCL_LIBS) $(MPI_CXX_LIBS)

$(CUDA_PTX): $(BUILD)/cuda/%.ptx: examples/%.cu $(wildcard cuda/*.h examples/*.h) rockmate.h $(BUILD)/flags
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_COMMON) -arch=compute_90 -ptx -o $@ $<

# The dummy device's builds (see DUMMY_TESTS above).
$(DUMMY_DIR)/dummy.o: tests/dummy/dummy.cc $(wildcard tests/dummy/*.h) $(BUILD)/flags
	@mkdir -p $(@D)
	$(CXX) $(DUMMY_CXXFLAGS) -O2 -c -o $@ $<

$(DUMMY_DIR)/rockmate_cuda.o: cuda/rockmate_cuda.cu cuda/rockmate_cuda.h $(wildcard tests/dummy/*.h) rockmate.h \
		$(BUILD)/flags
	@mkdir -p $(@D)
	$(CXX) $(DUMMY_CXXFLAGS) -O1 -x c++ -c -o $@ $<

.PRECIOUS: $(DUMMY_DIR)/%.cc
$(DUMMY_DIR)/%.cc: examples/%.cu
	@mkdir -p $(@D)
	{ echo '#line 1 "$<"'; $(DUMMY_LAUNCH_SED) $<; } > $@

$(DUMMY_DIR)/%.o: $(DUMMY_DIR)/%.cc $(wildcard examples/*.h cuda/*.h tests/dummy/*.h) rockmate.h $(BUILD)/flags
	$(CXX) $(DUMMY_CXXFLAGS) -Iexamples -O1 -c -o $@ $<

$(BUILD)/tests/gpt2_cuda_dummy: $(DUMMY_DIR)/gpt2_cuda.o $(DUMMY_OBJS) $(LIB_A)
	$(CXX) $(DUMMY_CXXFLAGS) -o $@ $^ $(LDLIBS)

# The stage mode on the dummy device: mpicxx compiles with $(CXX) (OMPI_CXX:
# Open MPI's wrapper; MPICH_CXX: MPICH's); no NCCL there.
$(DUMMY_DIR)/gpt2_cuda_mpi.o: $(DUMMY_DIR)/gpt2_cuda.cc $(wildcard examples/*.h examples/*.cuh cuda/*.h tests/dummy/*.h) \
		rockmate.h $(BUILD)/flags
	OMPI_CXX=$(CXX) MPICH_CXX=$(CXX) $(MPICXX) $(DUMMY_CXXFLAGS) -DGPT2_CUDA_MPI -DOMPI_SKIP_MPICXX -Iexamples -O1 \
		-c -o $@ $<

$(BUILD)/tests/gpt2_cuda_pipe_dummy: $(DUMMY_DIR)/gpt2_cuda_mpi.o $(DUMMY_OBJS) $(LIB_A)
	OMPI_CXX=$(CXX) MPICH_CXX=$(CXX) $(MPICXX) $(DUMMY_CXXFLAGS) -o $@ $^ $(LDLIBS)

# --wrap: the test sees what cuda/ asks of rkm_context_realloc.
$(BUILD)/tests/test_cuda: tests/test_cuda.cc tests/test.h $(DUMMY_OBJS) $(TEST_LIB)
	$(CXX) $(DUMMY_CXXFLAGS) -O1 -DTEST_GRAPHS_DIR=\"tests/graphs\" -Wl,--wrap=rkm_context_realloc -o $@ $< \
		$(DUMMY_OBJS) $(TEST_LIB) $(LDLIBS)

$(BUILD)/rockmate.pc: rockmate.h FORCE
	@mkdir -p $(@D)
	@printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$${prefix}/include' '' \
		'Name: rockmate' \
		'Description: plan and run activation re-materialization for training steps' \
		'Version: $(VERSION)' \
		'Cflags: -I$${includedir}' \
		'Libs: -L$${libdir} -lrockmate' \
		'Libs.private: $(STATIC_LIBS)' > $@

install: all $(BUILD)/rockmate.pc
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 rockmate.h $(DESTDIR)$(PREFIX)/include/rockmate.h
	install -m 644 $(LIB_A) $(DESTDIR)$(LIBDIR)/librockmate.a
	install -m 755 $(LIB_SO) $(DESTDIR)$(LIBDIR)/librockmate.so.$(VERSION)
	ln -sf librockmate.so.$(VERSION) $(DESTDIR)$(LIBDIR)/librockmate.so.$(SO_MAJOR)
	ln -sf librockmate.so.$(VERSION) $(DESTDIR)$(LIBDIR)/librockmate.so
	install -m 644 $(BUILD)/rockmate.pc $(DESTDIR)$(LIBDIR)/pkgconfig/rockmate.pc
	install -m 755 $(CLI_BIN) $(DESTDIR)$(PREFIX)/bin/rockmate

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/include/rockmate.h $(DESTDIR)$(LIBDIR)/librockmate.a \
		$(DESTDIR)$(LIBDIR)/librockmate.so $(DESTDIR)$(LIBDIR)/librockmate.so.$(SO_MAJOR) \
		$(DESTDIR)$(LIBDIR)/librockmate.so.$(VERSION) $(DESTDIR)$(LIBDIR)/pkgconfig/rockmate.pc \
		$(DESTDIR)$(PREFIX)/bin/rockmate
	@# the folders install made, where nothing else is left in them
	-rmdir $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(LIBDIR) $(DESTDIR)$(PREFIX)/include \
		$(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX) 2>/dev/null || true

clean:
	rm -rf $(BUILD)
