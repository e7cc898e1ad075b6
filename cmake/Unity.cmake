# Unity build: sources compile in batches of 8 per translation unit, so the big headers (nlohmann/json, gtest,
# Boost.Beast) are parsed once a batch instead of once a file — the largest share of a clean build on a 2-core
# machine, which CI builds four times. Every tree builds this way (CI's and developers'), so a clash between two
# files' internal names shows up everywhere; -DLATHE_UNITY=OFF builds file by file.
option(LATHE_UNITY "Compile sources in batches (CMake unity build)" ON)
if(LATHE_UNITY)
  set(CMAKE_UNITY_BUILD ON)
  set(CMAKE_UNITY_BUILD_BATCH_SIZE 8)
endif()

# Most files name nlohmann::ordered_json `json` at namespace scope; a file that gives the name to the plain
# nlohmann::json instead cannot share a batch with them (two aliases of one name), so it compiles on its own.
# Found by reading the sources, so a new file of either kind needs nothing here.
function(lathe_unity_exclusions)
  if(NOT LATHE_UNITY)
    return()
  endif()
  foreach(src ${ARGN})
    file(READ ${src} _text)
    if(_text MATCHES "using json = nlohmann::json;|using nlohmann::json;")
      set_source_files_properties(${src} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
    endif()
  endforeach()
endfunction()
