# CMake package config for the kvcache-spec C++ conformance driver (header-only, C++17), installed
# inside the Python package next to the header. Use it as you would pybind11's:
#
#   cmake -Dkvcache_conformance_DIR="$(kvcache cpp --cmakedir)" ...
#   find_package(kvcache_conformance CONFIG REQUIRED)
#   target_link_libraries(my_target PRIVATE kvcache_conformance::kvcache_conformance)
get_filename_component(kvcache_conformance_INCLUDE_DIR "${CMAKE_CURRENT_LIST_DIR}" ABSOLUTE)
set(kvcache_conformance_INCLUDE_DIRS "${kvcache_conformance_INCLUDE_DIR}")
if(NOT EXISTS "${kvcache_conformance_INCLUDE_DIR}/kvcache_conformance.hpp")
  set(kvcache_conformance_FOUND FALSE)
  set(kvcache_conformance_NOT_FOUND_MESSAGE "kvcache_conformance.hpp is missing from ${kvcache_conformance_INCLUDE_DIR}")
  return()
endif()
if(NOT TARGET kvcache_conformance::kvcache_conformance)
  add_library(kvcache_conformance::kvcache_conformance INTERFACE IMPORTED)
  set_target_properties(kvcache_conformance::kvcache_conformance PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${kvcache_conformance_INCLUDE_DIR}"
    INTERFACE_COMPILE_FEATURES cxx_std_17)
endif()
set(kvcache_conformance_FOUND TRUE)
