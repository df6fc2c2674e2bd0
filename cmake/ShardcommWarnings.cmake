# Warnings and sanitizers applied to shardcomm's own targets (not to consumers).
add_library(shardcomm_warnings INTERFACE)
target_compile_options(shardcomm_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Wnon-virtual-dtor>)
# GCC 12 warns -Wrestrict inside libstdc++'s std::string concatenation at -O2 and above, a false
# positive of its own headers (GCC bug 105329), in every file that builds a message with "+".
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12
   AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  target_compile_options(shardcomm_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
endif()

if(SHARDCOMM_SANITIZE)
  string(REPLACE ";" "," _san "${SHARDCOMM_SANITIZE}")
  add_compile_options(-fsanitize=${_san} -fno-omit-frame-pointer)
  if(SHARDCOMM_NO_SANITIZE)  # after -fsanitize, which would turn them back on
    string(REPLACE ";" "," _nosan "${SHARDCOMM_NO_SANITIZE}")
    add_compile_options(-fno-sanitize=${_nosan})
  endif()
  add_link_options(-fsanitize=${_san})
endif()
