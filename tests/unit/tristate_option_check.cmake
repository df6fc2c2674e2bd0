# cmake/ShardcommOptions.cmake's shardcomm_tristate on every kind of value a user may pass:
#   cmake -DSHARDCOMM_CMAKE_DIR=<source>/cmake -P tristate_option_check.cmake
# Runs itself again (-DVALUE=...) for the values that must stop configure.
include(${SHARDCOMM_CMAKE_DIR}/ShardcommOptions.cmake)
if(DEFINED VALUE)
  set(SHARDCOMM_WITH_X "${VALUE}")
  shardcomm_tristate(SHARDCOMM_WITH_X)
  return()
endif()

set(failures 0)
foreach(case "AUTO=AUTO" "auto=AUTO" "Auto=AUTO" "ON=ON" "on=ON" "1=ON" "TRUE=ON" "true=ON" "yes=ON" "Y=ON"
             "2=ON" "0.5=ON" "OFF=OFF" "off=OFF" "0=OFF" "FALSE=OFF" "false=OFF" "no=OFF" "N=OFF" "IGNORE=OFF"
             "NOTFOUND=OFF" "UCX-NOTFOUND=OFF" "=OFF" "0.0=OFF")
  string(FIND "${case}" "=" eq REVERSE)
  string(SUBSTRING "${case}" 0 ${eq} given)
  math(EXPR after "${eq} + 1")
  string(SUBSTRING "${case}" ${after} -1 want)
  set(SHARDCOMM_WITH_X "${given}")
  shardcomm_tristate(SHARDCOMM_WITH_X)
  if(NOT SHARDCOMM_WITH_X STREQUAL want)
    message("FAIL '${given}' -> '${SHARDCOMM_WITH_X}', expected ${want}")
    math(EXPR failures "${failures} + 1")
  endif()
endforeach()

foreach(given maybe required "ON OFF" AUTOMATIC)
  execute_process(COMMAND ${CMAKE_COMMAND} -DSHARDCOMM_CMAKE_DIR=${SHARDCOMM_CMAKE_DIR} "-DVALUE=${given}"
                          -P ${CMAKE_CURRENT_LIST_FILE}
                  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
  string(REGEX REPLACE "[ \n]+" " " err "${err}")
  if(rc EQUAL 0 OR NOT err MATCHES "SHARDCOMM_WITH_X='${given}' is not a choice: use AUTO")
    message("FAIL '${given}' must stop configure naming the option; exit ${rc}: ${err}")
    math(EXPR failures "${failures} + 1")
  endif()
endforeach()

if(failures)
  message(FATAL_ERROR "${failures} case(s) failed")
endif()
message("PASS: shardcomm_tristate")
