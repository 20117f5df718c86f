#!/usr/bin/env bash
# Build llama.cpp's C++ `llama-server` (CPU only, only that target) from the llama.cpp
# source that llama-cpp-python's sdist vendors, for the tests that run a real server.
#
#   bash scripts/build_llama_server.sh            # build (or reuse) and print the binary's path
#
# Output: .cache/llama-server/<version>/bin/llama-server (gitignored). A stamp file next to it
# records the sdist version and the cmake flags; when both match and the binary runs, the
# script prints the path and exits at once, so CI pays for the build only on a fresh machine.
#
# Environment:
#   LLAMA_CPP_PYTHON_VERSION  the sdist to build from (default below)
#   LLAMA_SERVER_SDIST        a local copy of that sdist (.tar.gz); otherwise pip downloads it
#   LLAMA_SERVER_CACHE        the output root (default .cache/llama-server in the repository)
#   LLAMA_SERVER_JOBS         parallel compile jobs (default: the number of cores)
#
# Only stdout carries the path (the last line); progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
cache="${LLAMA_SERVER_CACHE:-$PWD/.cache/llama-server}"
jobs="${LLAMA_SERVER_JOBS:-$(nproc 2>/dev/null || echo 2)}"
out="$cache/$version"
bin="$out/bin/llama-server"

# Everything off that the server does not need: no tests, examples or other tools, no web
# UI (the prebuilt one would be downloaded at build time), no HTTPS, no ccache (a fresh CI
# machine has no cache to hit, and it would write outside the repository). GGML_LLAMAFILE
# off drops sgemm.cpp, a large template file whose speed-up a 2-layer test model never needs.
# GGML_NATIVE stays on: compile for this CPU only, not every x86 variant.
flags=(
    -G Ninja
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF
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

mkdir -p "$out/bin"
cp "$work/build/bin/llama-server" "$bin"
cp "$src/LICENSE" "$out/LICENSE"
echo "$stamp_text" >"$out/stamp"
echo "built llama-server in $(( (end - start) / 60 )) min $(( (end - start) % 60 )) s" \
    "($jobs jobs, llama-cpp-python $version)" >&2
rm -rf "$work"
echo "$bin"
