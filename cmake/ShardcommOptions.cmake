# The optional parts' switches (SHARDCOMM_WITH_UCX, LIBCOMM_WITH_CUDA, ...) take AUTO, ON or OFF.
# shardcomm_tristate(<var>) makes <var> (in the caller's scope) exactly one of those three, so that
# the rest of the build may compare with STREQUAL: AUTO in any case stays AUTO, CMake's boolean
# constants count as they do in if() (on/1/TRUE/yes/y or a non-zero number -> ON; off/0/FALSE/no/n/
# IGNORE/NOTFOUND/*-NOTFOUND or empty -> OFF), and anything else stops configure naming the option.
# Compared as written, -DSHARDCOMM_WITH_UCX=off acted as AUTO and =TRUE did not make UCX required.
# The cache keeps what the user wrote; the status lines print the normalised value.
function(shardcomm_tristate var)
  string(TOUPPER "${${var}}" value)
  if(value STREQUAL "AUTO")
    set(value AUTO)
  elseif(value MATCHES "^(ON|YES|Y|TRUE)$" OR value MATCHES "^[0-9]*\\.?[0-9]+$" AND NOT value MATCHES "^[0.]+$")
    set(value ON)
  elseif(value MATCHES "^(OFF|NO|N|FALSE|IGNORE|NOTFOUND|[0.]*)$" OR value MATCHES "-NOTFOUND$")
    set(value OFF)
  else()
    message(FATAL_ERROR "${var}='${${var}}' is not a choice: use AUTO (when found), ON (required) or OFF "
                        "(or a CMake boolean such as 1, 0, TRUE, FALSE)")
  endif()
  set(${var} ${value} PARENT_SCOPE)
endfunction()
