# Source on a GPU machine before running build-gpu/hetplan: the unpacked
# Debian libraries, and NVLink multicast kept off (it can take a shared
# host's GPUs out of service).
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
