# Runs one consumption case: MODE = find_package (install iattn to a prefix, then find it) or
# add_subdirectory (the consumer adds the source tree).
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()
if(MODE STREQUAL "find_package")
  run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK}/iattn-build -G ${GENERATOR}
      -DIATTN_BUILD_TESTS=OFF -DIATTN_BUILD_EXAMPLES=OFF -DCMAKE_INSTALL_PREFIX=${WORK}/prefix)
  run(${CMAKE_COMMAND} --install ${WORK}/iattn-build)
  run(${CMAKE_COMMAND} -S ${CONSUMER} -B ${WORK}/consumer-build -G ${GENERATOR}
      -DCMAKE_PREFIX_PATH=${WORK}/prefix -DIATTN_CONSUME=find_package)
else()
  run(${CMAKE_COMMAND} -S ${CONSUMER} -B ${WORK}/consumer-build -G ${GENERATOR}
      -DIATTN_CONSUME=add_subdirectory -DIATTN_SOURCE_DIR=${SOURCE_DIR})
endif()
run(${CMAKE_COMMAND} --build ${WORK}/consumer-build)
run(${WORK}/consumer-build/consumer)
message(STATUS "consumer built and ran through ${MODE}")
