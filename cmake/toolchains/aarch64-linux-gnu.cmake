# Cross build for 64-bit Arm Linux with Debian's cross compiler (g++-aarch64-linux-gnu); the tests run under
# qemu-user (CMAKE_CROSSCOMPILING_EMULATOR, which ctest and gtest_discover_tests honour). Use it with
# -DLATHE_KERNELS_ONLY=ON (scripts/cross_arm64.sh): only the CPU kernels and their tests build for the target.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;/usr/aarch64-linux-gnu)
