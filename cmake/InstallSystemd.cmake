# Run by `cmake --install` (install(CODE) in the top CMakeLists.txt): writes
# the systemd units from systemd/*.in with the *install-time* prefix, so
# `cmake --install build --prefix /usr` and `--prefix /usr/local` both give
# units whose ExecStart= names the loaderxd they just installed and whose
# Documentation= names an installed file. Honours DESTDIR (staging roots).
#
# Inputs: LOADERX_SOURCE_DIR, LOADERX_BINDIR, LOADERX_DOCDIR (relative to the
# prefix, or absolute).
foreach(_v LOADERX_SOURCE_DIR LOADERX_BINDIR LOADERX_DOCDIR)
  if(NOT DEFINED ${_v})
    message(FATAL_ERROR "InstallSystemd.cmake: ${_v} is not set")
  endif()
endforeach()
function(_lx_full out rel)
  if(IS_ABSOLUTE "${rel}")
    set(${out} "${rel}" PARENT_SCOPE)
  else()
    set(${out} "${CMAKE_INSTALL_PREFIX}/${rel}" PARENT_SCOPE)
  endif()
endfunction()
_lx_full(_bindir "${LOADERX_BINDIR}")
_lx_full(_docdir "${LOADERX_DOCDIR}")
set(_root "$ENV{DESTDIR}")
# systemd looks in <prefix>/lib/systemd/{system,user}, <prefix>/lib/tmpfiles.d
# and <prefix>/lib/sysusers.d for both /usr and /usr/local.
set(_lib "${CMAKE_INSTALL_PREFIX}/lib")
foreach(_pair "loaderxd.service:systemd/system" "loaderxd.socket:systemd/system"
              "loaderxd-user.service:systemd/user" "loaderxd-user.socket:systemd/user")
  string(REPLACE ":" ";" _pair "${_pair}")
  list(GET _pair 0 _unit)
  list(GET _pair 1 _dir)
  file(READ "${LOADERX_SOURCE_DIR}/systemd/${_unit}.in" _text)
  string(REPLACE "@LOADERXD@" "${_bindir}/loaderxd" _text "${_text}")
  string(REPLACE "@LOADERX_DOCDIR@" "${_docdir}" _text "${_text}")
  set(_dest "${_root}${_lib}/${_dir}/${_unit}")
  message(STATUS "Installing: ${_dest}")
  file(WRITE "${_dest}" "${_text}")
endforeach()
foreach(_pair "loaderx.tmpfiles:tmpfiles.d" "loaderx.sysusers:sysusers.d")
  string(REPLACE ":" ";" _pair "${_pair}")
  list(GET _pair 0 _src)
  list(GET _pair 1 _dir)
  set(_dest "${_root}${_lib}/${_dir}/loaderx.conf")
  message(STATUS "Installing: ${_dest}")
  file(MAKE_DIRECTORY "${_root}${_lib}/${_dir}")
  file(COPY_FILE "${LOADERX_SOURCE_DIR}/systemd/${_src}" "${_dest}")
endforeach()
