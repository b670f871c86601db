#!/usr/bin/env bash
# bench/gpu_bundle.sh [BUILD_DIR] [BUNDLE_DIR]
#
# Run HERE (the build machine), not on the GPU machine: copies what
# bench/gpu_check.sh needs into BUNDLE_DIR (default build-gpubundle, ignored
# by git through /build*), so that it can be carried to a GPU machine that has
# no package registry:
#   bin/  the GPU test binaries, the daemons, kolorun and kolo-gpu-bench, stripped
#   lib/  libkolo.so (for the Python package: kolo.torch on CUDA)
#         and every shared library they load that is not part of the C
#         library (ldd), except libcuda (the driver's) and libnccl (208 MiB;
#         the GPU image has it in the nvidia-nccl-cu13 wheel, which
#         gpu_check.sh finds)
# The Python package, tests and examples travel with the working tree.
#   origin_bin_dir  BUILD_DIR/bin as an absolute path: the integration
#         harness has it compiled in, and gpu_check.sh links it to bin/.
# Build first (CUDA and NCCL on, tests on):
#   ninja -C build kolo_gpu_plan_tests kolo_gpu_tests kolo_gpu_test_peer \
#     kolo-gpu-bench kolo_gpu_device_path_tests kolo_gpu_device_rank kolo_gpu_seam_tests \
#     kolo_gpu_seam_rank kolo_gpu_nccl_process_tests kolo_gpu_nccl_rank kolo_cli_tests \
#     kolo_gpu_nccl_cross_tests kolo-agent kolo-coordinator kolorun kolo kolo_client kolo-bench
# Then, with the device tool: run(command="bench/gpu_issue16.sh build-gpubundle",
# carry=["build-gpubundle"]) (or bench/gpu_check.sh for the C++ part only).
# The bundle (packed) and the working tree must stay under the tool's 64 MiB.
set -euo pipefail

BUILD_DIR=$(cd "${1:-build}" && pwd)
BUNDLE=${2:-build-gpubundle}
BINS=(kolo_gpu_plan_tests kolo_gpu_tests kolo_gpu_test_peer kolo-gpu-bench kolo_gpu_device_path_tests
      kolo_gpu_device_rank kolo_gpu_seam_tests kolo_gpu_seam_rank kolo_gpu_nccl_process_tests
      kolo_gpu_nccl_rank kolo_cli_tests kolo_gpu_nccl_cross_tests kolo-agent kolo-coordinator
      kolorun kolo kolo-bench)

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib"
for b in "${BINS[@]}"; do
  [[ -x "$BUILD_DIR/bin/$b" ]] || { echo "missing $BUILD_DIR/bin/$b: build it first" >&2; exit 1; }
  cp "$BUILD_DIR/bin/$b" "$BUNDLE/bin/"
  strip --strip-unneeded "$BUNDLE/bin/$b"
done
[[ -e "$BUILD_DIR/lib/libkolo.so" ]] || { echo "missing $BUILD_DIR/lib/libkolo.so: build kolo_client" >&2; exit 1; }
cp -L "$BUILD_DIR/lib/libkolo.so" "$BUNDLE/lib/libkolo.so"
strip --strip-unneeded "$BUNDLE/lib/libkolo.so"
# Libraries, resolved here; the C library's own stay behind (the GPU
# machine's are newer), libstdc++ and libgcc_s travel (older is never wrong
# for these binaries, newer is the machine's business).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|librt|libdl|libutil|libresolv|libcuda\.so|libnccl\.so)'
for b in "${BINS[@]/#/bin/}" lib/libkolo.so; do
  ldd "$BUILD_DIR/$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $skip ]] && continue
  cp -L "$path" "$BUNDLE/lib/$name"
  strip --strip-unneeded "$BUNDLE/lib/$name" 2>/dev/null || true
done
echo "$BUILD_DIR/bin" > "$BUNDLE/origin_bin_dir"
# The device tool carries at most 64 MiB, the working tree included, and the
# bundle alone is about 62 MiB: it travels as one xz archive (about 14 MiB),
# which bench/gpu_issue16.sh and bench/gpu_check.sh unpack in place on the
# GPU machine. KOLO_GPU_BUNDLE_PACK=0 leaves it unpacked (for a run here).
if [[ ${KOLO_GPU_BUNDLE_PACK:-1} != 0 ]]; then
  echo "unpacked: $(du -sh "$BUNDLE" | cut -f1)"
  tar -C "$BUNDLE" -cf - bin lib origin_bin_dir | xz -T2 -6 > "$BUNDLE/bundle.tar.xz"
  rm -rf "$BUNDLE/bin" "$BUNDLE/lib" "$BUNDLE/origin_bin_dir"
fi
du -sh "$BUNDLE"
