# xgrammar (Apache-2.0), the grammar engine of structured output, built from the source that
# scripts/fetch_xgrammar.sh unpacks into third_party/ (never committed). Only its C++ core, as a
# static library with our flags: none of its Python bindings, tests, cpptrace, -Werror or LTO.
# Without the source, STRATA_HAVE_XGRAMMAR is OFF and common/grammar refuses every format.
set(STRATA_XGRAMMAR_VERSION 0.2.9)
set(STRATA_XGRAMMAR_DIR ${CMAKE_SOURCE_DIR}/third_party/xgrammar-${STRATA_XGRAMMAR_VERSION}
    CACHE PATH "xgrammar's unpacked source (scripts/fetch_xgrammar.sh)")
set(STRATA_HAVE_XGRAMMAR OFF)
if(EXISTS ${STRATA_XGRAMMAR_DIR}/include/xgrammar/xgrammar.h)
  file(GLOB strata_xgrammar_sources CONFIGURE_DEPENDS
       ${STRATA_XGRAMMAR_DIR}/cpp/*.cc ${STRATA_XGRAMMAR_DIR}/cpp/support/*.cc
       ${STRATA_XGRAMMAR_DIR}/cpp/converter_ext/*.cc)
  add_library(xgrammar STATIC ${strata_xgrammar_sources})
  # Its own standard and warnings: third-party code, not held to ours.
  set_target_properties(xgrammar PROPERTIES CXX_STANDARD 17 POSITION_INDEPENDENT_CODE ON)
  target_compile_options(xgrammar PRIVATE -w)
  target_include_directories(xgrammar PUBLIC ${STRATA_XGRAMMAR_DIR}/include)
  target_include_directories(xgrammar SYSTEM PUBLIC ${STRATA_XGRAMMAR_DIR}/3rdparty/picojson
                             ${STRATA_XGRAMMAR_DIR}/3rdparty/dlpack/include)
  target_compile_definitions(xgrammar PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0
                             XGRAMMAR_ENABLE_INTERNAL_CHECK=0)
  target_link_libraries(xgrammar PUBLIC Threads::Threads)
  set(STRATA_HAVE_XGRAMMAR ON)
endif()
message(STATUS "Strata grammar engine (xgrammar ${STRATA_XGRAMMAR_VERSION}): ${STRATA_HAVE_XGRAMMAR}")
