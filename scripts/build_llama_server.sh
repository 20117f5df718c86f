#!/usr/bin/env bash
# Build llama.cpp's C++ `llama-server` (CPU only, only that target) from the llama.cpp
# source that llama-cpp-python's sdist vendors, for the tests that run a real server.
#
#   bash scripts/build_llama_server.sh            # build (or reuse) and print the binary's path
#
# Output: $ROLLSTREAM_CACHE/llama-server/<version>/bin/ (default ~/.cache/rollstream, outside
# the clone so that CI's fresh clones on the same machine reuse it): llama-server and the
# shared libraries it loads. A stamp file records the sdist version and the cmake flags; when
# both match and the binary runs, the script prints the path and exits at once, so only a
# fresh machine pays for the build.
#
# Environment:
#   LLAMA_CPP_PYTHON_VERSION  the sdist to build from (default below)
#   LLAMA_SERVER_SDIST        a local copy of that sdist (.tar.gz); otherwise pip downloads it
#   ROLLSTREAM_CACHE          the cache root (default ${XDG_CACHE_HOME:-~/.cache}/rollstream)
#   LLAMA_SERVER_JOBS         parallel compile jobs (default: the number of cores)
#
# Only stdout carries the path (the last line); progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
cache="${ROLLSTREAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rollstream}/llama-server"
jobs="${LLAMA_SERVER_JOBS:-$(nproc 2>/dev/null || echo 2)}"
out="$cache/$version"
bin="$out/bin/llama-server"

# Everything off that the server does not need: no tests, examples or other tools, no web
# UI (the prebuilt one would be downloaded at build time), no HTTPS, no ccache (a fresh
# machine has no cache to hit; the stamp below is the reuse that counts). GGML_LLAMAFILE
# off drops sgemm.cpp, a large template file whose speed-up a 2-layer test model never needs.
# GGML_NATIVE stays on: compile for this CPU only, not every x86 variant. C++ at -O1 (C, that
# is ggml's core, stays at Release's -O3): g++ compiles src/llama-vocab.cpp in 9.2 s of CPU
# at -O1 against 15.9 s at -O3 (6.0 s at -O0, measured here), and a 2-layer test model needs
# no more speed than -O1 gives.
# Shared libraries with an $ORIGIN rpath: bin/ holds llama-server and libllama/libggml*, so
# the same build also serves llama-cpp-python's ctypes bindings (LLAMA_CPP_LIB_PATH) when
# its own server is run for comparison, with no second compile.
flags=(
    -G Ninja
    -DCMAKE_BUILD_TYPE=Release
    '-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG'
    -DBUILD_SHARED_LIBS=ON
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON
    '-DCMAKE_INSTALL_RPATH=$ORIGIN'
    -DGGML_CCACHE=OFF
    -DGGML_NATIVE=ON
    -DGGML_LLAMAFILE=OFF
    -DGGML_OPENMP=ON
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_BUILD_APP=OFF
    -DLLAMA_BUILD_UI=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_OPENSSL=OFF
)
command -v ninja >/dev/null 2>&1 || flags=("${flags[@]:2}")   # make, when ninja is missing
stamp_text="llama-cpp-python==$version ${flags[*]}"

if [ -x "$bin" ] && [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp_text" ] \
    && "$bin" --version >/dev/null 2>&1; then
    echo "llama-server already built from llama-cpp-python $version" >&2
    echo "$bin"
    exit 0
fi

for tool in cmake c++ cc; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "build_llama_server: $tool not found (install cmake and a C++ compiler)" >&2
        exit 2
    fi
done

work="$cache/build-$version"
rm -rf "$work"
mkdir -p "$work"
sdist="${LLAMA_SERVER_SDIST:-}"
if [ -z "$sdist" ]; then
    echo "downloading the llama-cpp-python $version sdist" >&2
    # pip reads the sdist's metadata through its build backend (scikit-build-core, installed
    # as a wheel in an isolated env); only llama-cpp-python itself is taken as source
    python3 -m pip download -q --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$version" -d "$work/dl" >&2
    sdist="$(ls "$work"/dl/llama_cpp_python-"$version".tar.gz)"
fi
echo "unpacking $sdist" >&2
tar -xzf "$sdist" -C "$work"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
[ -f "$src/tools/server/CMakeLists.txt" ] || {
    echo "build_llama_server: $sdist has no vendored llama.cpp server" >&2
    exit 1
}

start=$(date +%s)
echo "configuring (${flags[*]})" >&2
cmake -S "$src" -B "$work/build" "${flags[@]}" >"$work/configure.log" 2>&1 || {
    tail -30 "$work/configure.log" >&2
    exit 1
}
echo "building llama-server with $jobs jobs" >&2
cmake --build "$work/build" --target llama-server -j "$jobs" >"$work/build.log" 2>&1 || {
    tail -40 "$work/build.log" >&2
    exit 1
}
end=$(date +%s)
# CPU seconds of the compile (children of this shell): wall time on an idle machine with
# $jobs cores is about their sum / $jobs
times >"$work/times"   # not in $(...): a subshell has no children of its own
cpu=$(tail -1 "$work/times")

rm -rf "$out/bin"
mkdir -p "$out/bin"
cp "$work/build/bin/llama-server" "$bin"
cp -P "$work"/build/bin/lib*.so* "$out/bin/"
cp "$src/LICENSE" "$out/LICENSE"
echo "$stamp_text" >"$out/stamp"
echo "built llama-server in $(( (end - start) / 60 )) min $(( (end - start) % 60 )) s" \
    "($jobs jobs, llama-cpp-python $version; compile cpu user/sys: $cpu)" >&2
rm -rf "$work"
echo "$bin"
