"""`pairctl build`: exact-revision source export, toolchain checks, CMake, package store."""
