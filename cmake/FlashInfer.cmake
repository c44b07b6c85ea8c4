# FlashInfer's attention kernels are header-only CUDA C++; the library takes the headers from one
# pinned release of the flashinfer-python wheel on PyPI, which carries them (flashinfer/data/include)
# together with a CCCL newer than CUDA 13.0's, which they need. Nothing of FlashInfer is in this
# repository. FlashInfer is Apache-2.0; the CCCL and CUTLASS it bundles keep their own licenses
# (docs/building.md#flashinfer).
#
# SWIFTKV_WITH_FLASHINFER: AUTO (with CUDA, when the headers can be had), ON (fail without them), OFF.
# Where the headers come from, first found:
#   SWIFTKV_FLASHINFER_DIR    a directory holding FlashInfer's include/ and cccl/ (the wheel's
#                             flashinfer/data, unpacked);
#   SWIFTKV_FLASHINFER_WHEEL  the wheel file, already downloaded (a build without network);
#   else the wheel is downloaded from PyPI into SWIFTKV_DOWNLOAD_CACHE (default
#   ~/.cache/swiftkv/downloads), its SHA-256 checked, and unpacked there once.
# Sets SWIFTKV_HAVE_FLASHINFER and the INTERFACE target swiftkv_flashinfer_headers.

set(SWIFTKV_FLASHINFER_VERSION 0.7.2.post1)
set(SWIFTKV_FLASHINFER_SHA256 bfdc18b9e1e4d8d0730fe4343dc0e284cd0c160086de80f99888bc4867922d49)
set(SWIFTKV_FLASHINFER_URL
    "https://files.pythonhosted.org/packages/b6/ad/da1fc7644b28ab82db922021955a0c85c8d6b3b1d6db224a13ef65cef85e/flashinfer_python-${SWIFTKV_FLASHINFER_VERSION}-py3-none-any.whl")

set(SWIFTKV_WITH_FLASHINFER AUTO CACHE STRING "FlashInfer's attention headers: AUTO, ON or OFF")
set_property(CACHE SWIFTKV_WITH_FLASHINFER PROPERTY STRINGS AUTO ON OFF)
set(SWIFTKV_FLASHINFER_DIR "" CACHE PATH "FlashInfer's unpacked flashinfer/data (include/, cccl/)")
set(SWIFTKV_FLASHINFER_WHEEL "" CACHE FILEPATH
    "flashinfer_python-${SWIFTKV_FLASHINFER_VERSION}-py3-none-any.whl, already downloaded")
if(DEFINED ENV{HOME})
  set(_swiftkv_cache_default "$ENV{HOME}/.cache/swiftkv/downloads")
else()
  set(_swiftkv_cache_default "${CMAKE_BINARY_DIR}/_downloads")
endif()
set(SWIFTKV_DOWNLOAD_CACHE "${_swiftkv_cache_default}" CACHE PATH
    "Where pinned downloads (the FlashInfer wheel) are kept between builds")

set(SWIFTKV_HAVE_FLASHINFER OFF)
if(NOT SWIFTKV_WITH_FLASHINFER MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "SWIFTKV_WITH_FLASHINFER must be AUTO, ON or OFF, not "
                      "'${SWIFTKV_WITH_FLASHINFER}'")
endif()

# Why the headers are missing, in words a user can act on; FATAL with ON, a warning with AUTO.
function(_swiftkv_flashinfer_missing why)
  string(CONCAT hint "set SWIFTKV_FLASHINFER_WHEEL to a downloaded "
         "flashinfer_python-${SWIFTKV_FLASHINFER_VERSION}-py3-none-any.whl (sha256 "
         "${SWIFTKV_FLASHINFER_SHA256}), or SWIFTKV_FLASHINFER_DIR to its unpacked "
         "flashinfer/data, or SWIFTKV_WITH_FLASHINFER=OFF")
  if(SWIFTKV_WITH_FLASHINFER STREQUAL "ON")
    message(FATAL_ERROR "FlashInfer: ${why}; ${hint}")
  endif()
  message(WARNING "FlashInfer: ${why}; building without it (${hint})")
endfunction()

# Unpacks `wheel` (after checking its hash) into `dest` once; sets `out` to dest's
# flashinfer/data, or to "" with a reason in `why`.
function(_swiftkv_flashinfer_unpack wheel dest out why)
  set(${out} "" PARENT_SCOPE)
  file(SHA256 "${wheel}" got)
  if(NOT got STREQUAL SWIFTKV_FLASHINFER_SHA256)
    set(${why} "${wheel} has sha256 ${got}, not the pinned release's" PARENT_SCOPE)
    return()
  endif()
  if(NOT EXISTS "${dest}/.complete")
    file(REMOVE_RECURSE "${dest}")
    file(MAKE_DIRECTORY "${dest}")
    # A wheel is a zip; only the headers and the CCCL they use are needed.
    execute_process(
      COMMAND ${CMAKE_COMMAND} -E tar xf "${wheel}" -- flashinfer/data/include flashinfer/data/cccl
              flashinfer_python-${SWIFTKV_FLASHINFER_VERSION}.dist-info
      WORKING_DIRECTORY "${dest}" RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
    if(NOT rc EQUAL 0 OR NOT EXISTS "${dest}/flashinfer/data/include/flashinfer/attention/prefill.cuh")
      set(${why} "unpacking ${wheel} failed: ${err}" PARENT_SCOPE)
      return()
    endif()
    file(TOUCH "${dest}/.complete")
  endif()
  set(${out} "${dest}/flashinfer/data" PARENT_SCOPE)
endfunction()

if(SWIFTKV_HAVE_CUDA AND NOT SWIFTKV_WITH_FLASHINFER STREQUAL "OFF")
  set(_fi_data "")
  set(_fi_why "")
  set(_fi_unpacked "${SWIFTKV_DOWNLOAD_CACHE}/flashinfer-${SWIFTKV_FLASHINFER_VERSION}")
  if(SWIFTKV_FLASHINFER_DIR)
    if(EXISTS "${SWIFTKV_FLASHINFER_DIR}/include/flashinfer/attention/prefill.cuh")
      set(_fi_data "${SWIFTKV_FLASHINFER_DIR}")
    else()
      string(CONCAT _fi_why "SWIFTKV_FLASHINFER_DIR=${SWIFTKV_FLASHINFER_DIR} has no "
             "include/flashinfer/attention/prefill.cuh")
    endif()
  elseif(SWIFTKV_FLASHINFER_WHEEL)
    if(EXISTS "${SWIFTKV_FLASHINFER_WHEEL}")
      _swiftkv_flashinfer_unpack("${SWIFTKV_FLASHINFER_WHEEL}" "${_fi_unpacked}" _fi_data _fi_why)
    else()
      set(_fi_why "SWIFTKV_FLASHINFER_WHEEL=${SWIFTKV_FLASHINFER_WHEEL} does not exist")
    endif()
  elseif(EXISTS "${_fi_unpacked}/.complete")
    set(_fi_data "${_fi_unpacked}/flashinfer/data")
  else()
    set(_fi_wheel "${SWIFTKV_DOWNLOAD_CACHE}/flashinfer_python-${SWIFTKV_FLASHINFER_VERSION}-py3-none-any.whl")
    if(NOT EXISTS "${_fi_wheel}")
      message(STATUS "FlashInfer: downloading flashinfer-python ${SWIFTKV_FLASHINFER_VERSION} "
                     "from PyPI (62 MB, once, into ${SWIFTKV_DOWNLOAD_CACHE})")
      file(DOWNLOAD "${SWIFTKV_FLASHINFER_URL}" "${_fi_wheel}.part" STATUS _fi_status
           TIMEOUT 600 EXPECTED_HASH SHA256=${SWIFTKV_FLASHINFER_SHA256})
      list(GET _fi_status 0 _fi_code)
      if(_fi_code EQUAL 0)
        file(RENAME "${_fi_wheel}.part" "${_fi_wheel}")
      else()
        file(REMOVE "${_fi_wheel}.part")
        list(GET _fi_status 1 _fi_msg)
        set(_fi_why "downloading ${SWIFTKV_FLASHINFER_URL} failed (${_fi_msg})")
      endif()
    endif()
    if(EXISTS "${_fi_wheel}")
      _swiftkv_flashinfer_unpack("${_fi_wheel}" "${_fi_unpacked}" _fi_data _fi_why)
    endif()
  endif()
  if(_fi_data)
    add_library(swiftkv_flashinfer_headers INTERFACE)
    # System includes: their warnings are not this project's to fix, and -Werror stays ours.
    target_include_directories(
      swiftkv_flashinfer_headers SYSTEM
      INTERFACE "${_fi_data}/cccl/libcudacxx/include" "${_fi_data}/cccl/cub"
                "${_fi_data}/cccl/thrust" "${_fi_data}/include")
    target_compile_options(swiftkv_flashinfer_headers
                           INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
    set(SWIFTKV_FLASHINFER_DATA "${_fi_data}")
    set(SWIFTKV_HAVE_FLASHINFER ON)
    # The library carries code compiled from FlashInfer's headers: its install carries
    # FlashInfer's license (the wheel's, beside flashinfer/data) and a notice naming it and the
    # CCCL's (Apache-2.0 with LLVM exceptions, as its headers' SPDX lines say).
    set(_fi_license
        "${_fi_data}/../../flashinfer_python-${SWIFTKV_FLASHINFER_VERSION}.dist-info/licenses/LICENSE")
    set(_fi_notice "${CMAKE_BINARY_DIR}/third-party/flashinfer/NOTICE")
    file(WRITE "${_fi_notice}"
         "libswiftkv contains code compiled from FlashInfer ${SWIFTKV_FLASHINFER_VERSION} "
         "(https://github.com/flashinfer-ai/flashinfer), Apache License 2.0: LICENSE beside this "
         "file.\nThat code includes NVIDIA CCCL headers shipped with FlashInfer, Apache License 2.0 "
         "with LLVM Exceptions (SPDX: Apache-2.0 WITH LLVM-exception).\n")
    set(_fi_doc "${CMAKE_INSTALL_DATADIR}/doc/swiftkv/third-party/flashinfer")
    install(FILES "${_fi_notice}" DESTINATION "${_fi_doc}")
    if(EXISTS "${_fi_license}")
      install(FILES "${_fi_license}" DESTINATION "${_fi_doc}")
    else()
      message(WARNING "FlashInfer: no license file at ${_fi_license}; the install carries only "
                      "the notice naming its license")
    endif()
  else()
    _swiftkv_flashinfer_missing("${_fi_why}")
  endif()
elseif(SWIFTKV_WITH_FLASHINFER STREQUAL "ON")
  message(FATAL_ERROR "SWIFTKV_WITH_FLASHINFER=ON needs a CUDA build")
endif()
