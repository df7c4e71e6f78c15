# lib.sh - the start the device scripts share, sourced by each (on the GPU
# machine, from the checkout's root): root, the carry C, $OUT made, log
# with the seconds since the start, and the steps that ready a carry that
# tools/device/pack.sh made.
root=$PWD
C=$root/.device-carry
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
t0=$SECONDS
log() { echo "[$(date +%T) +$((SECONDS - t0))s] $*"; }

# pack.sh's archive unpacked, once: bin/, lib/ and fixtures/ beside it.
dev_extract() {
  if [[ -f $C/pack.tar.xz && ! -d $C/bin ]]; then tar -C "$C" -xJf "$C/pack.tar.xz"; fi
}

# The carried libraries ahead of CUDA's; `dev_libs cublas` adds the cuBLAS
# of the image's Python nvidia package after those (an empty entry when it
# has none).
dev_libs() {
  local cublas_dir=
  if [[ ${1:-} == cublas ]]; then
    cublas_dir=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(os.path.dirname(nvidia.cublas.__file__), "lib"))' 2>/dev/null || true):
  fi
  export LD_LIBRARY_PATH=$C/lib:/usr/local/cuda/lib64:${cublas_dir}${LD_LIBRARY_PATH:-}
}

# Everything a pack.sh carry needs: unpacked, /work/main pointed here (the
# binaries were built there and carry that path for models/demo and
# tests/data), the libraries found (dev_libs' argument passed on) and the
# tests sent to the carried fixtures (the absent sets' tests skip, saying so)
# and to the carried lumen.
dev_unpack() {
  dev_extract
  mkdir -p /work && ln -sfn "$root" /work/main
  dev_libs "$@"
  export LUMEN_FIXTURES=$C/fixtures LUMEN_FIXTURES_PARTIAL=1
  # the tests that run the CLI or a server take the carried binary, not the
  # build path compiled into lumen_tests
  if [[ -x $C/bin/lumen ]]; then export LUMEN_BIN=$C/bin/lumen; fi
}

# A random Llama-3.1-8B-shaped GGUF of KIND (make_random_gguf.py's kinds:
# bf16, q4km, ...) at OUT, made from the carried llama-g256 fixture (pack
# with LUMEN_DEVICE_FIXTURES=gguf/llama-g256/model.Q4_K_M.gguf); /dev/shm
# grown first, since that is where such files go. A warm machine keeps
# /dev/shm between calls: the file is reused only when OUT.stamp says the
# same make_random_gguf.py and KIND wrote it.
dev_random_gguf() { # OUT KIND
  mount -o remount,size=100G /dev/shm 2>/dev/null
  local stamp
  stamp="$(sha1sum < "$root/tools/make_random_gguf.py" | cut -c1-40) $2 8b"
  [[ -f $1 && -f $1.stamp && $(cat "$1.stamp") == "$stamp" ]] && return 0
  rm -f "$1.stamp"
  python3 "$root/tools/make_random_gguf.py" "$C/fixtures/gguf/llama-g256/model.Q4_K_M.gguf" "$1" "$2" 8b >/dev/null ||
    { log "could not write $1"; exit 1; }
  echo "$stamp" > "$1.stamp"
}

# llama.cpp from the carried source node-llama-cpp bundles
# ($C/llamacpp-src.tar.xz) built for the H200 in the background into
# $LB (bp: the build's pid; its log $OUT/lc_build.log): TARGETS default
# llama-bench.
dev_llamacpp_cuda() {
  LC=/tmp/lc; LB=$LC/b/bin
  mkdir -p $LC && tar -C $LC -xJf "$C/llamacpp-src.tar.xz"
  (cd $LC && cmake -B b -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
     -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
     -DCMAKE_BUILD_TYPE=Release && cmake --build b -j12 --target "${@:-llama-bench}") > "$OUT/lc_build.log" 2>&1 &
  bp=$!
}
