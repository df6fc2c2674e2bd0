# Warnings and sanitizers applied to shardcomm's own targets (not to consumers).
add_library(shardcomm_warnings INTERFACE)
target_compile_options(shardcomm_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Wnon-virtual-dtor>)

if(SHARDCOMM_SANITIZE)
  string(REPLACE ";" "," _san "${SHARDCOMM_SANITIZE}")
  add_compile_options(-fsanitize=${_san} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${_san})
endif()
