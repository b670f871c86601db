# kolo's one Python interpreter for CMake (issue 37): KOLO_PYTHON, a cache
# variable whose default is what scripts/python-env.sh exports (the virtual
# environment scripts/install-python.sh makes: $KOLO_PYTHON, else
# $KOLO_VENV/bin/python, else /opt/kolo/venv/bin/python, ...). Included by
# every CMakeLists.txt that registers a Python test; never /usr/bin/python3.
#
#   kolo_python_can_import(<result-var> <module>...)  TRUE when KOLO_PYTHON imports them all
#   kolo_python_for_stdlib_tests(<out-var>)           KOLO_PYTHON, or (not under CI=true, when
#                                                     the environment is missing) the machine's
#                                                     python3 for tests that need only the
#                                                     standard library and PyYAML

if(NOT DEFINED CACHE{KOLO_PYTHON})
  execute_process(
    COMMAND sh -c ". '${PROJECT_SOURCE_DIR}/scripts/python-env.sh' && printf %s \"$KOLO_PYTHON\""
    OUTPUT_VARIABLE _kolo_python_default RESULT_VARIABLE _kolo_python_rc ERROR_QUIET)
  if(NOT _kolo_python_rc EQUAL 0 OR _kolo_python_default STREQUAL "")
    set(_kolo_python_default /opt/kolo/venv/bin/python)
  endif()
  set(KOLO_PYTHON "${_kolo_python_default}" CACHE FILEPATH
      "kolo's Python interpreter for every Python test, example and benchmark (scripts/python-env.sh; made by scripts/install-python.sh)")
endif()

set(KOLO_PYTHON_IN_CI OFF)
if(DEFINED ENV{CI} AND "$ENV{CI}" STREQUAL "true")
  set(KOLO_PYTHON_IN_CI ON)
endif()

function(kolo_python_can_import result)
  execute_process(
    COMMAND "${KOLO_PYTHON}" -c "import sys; [__import__(m) for m in sys.argv[1:]]" ${ARGN}
    RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_VARIABLE _err)
  if(_rc EQUAL 0)
    set(${result} TRUE PARENT_SCOPE)
  else()
    string(REGEX REPLACE "\n$" "" _err "${_err}")
    string(REGEX REPLACE ".*\n" "" _err "${_err}")  # the last line: the ImportError
    list(JOIN ARGN ", " _mods)
    set(${result} FALSE PARENT_SCOPE)
    set(${result}_WHY "${KOLO_PYTHON} cannot import ${_mods} (${_rc}): ${_err}" PARENT_SCOPE)
  endif()
endfunction()

function(kolo_python_for_stdlib_tests out)
  if(EXISTS "${KOLO_PYTHON}" OR KOLO_PYTHON_IN_CI)
    set(${out} "${KOLO_PYTHON}" PARENT_SCOPE)  # under CI a missing one fails the tests loudly
    return()
  endif()
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    message(STATUS "kolo: ${KOLO_PYTHON} does not exist (scripts/install-python.sh makes it); "
                   "tests that need only the standard library use ${Python3_EXECUTABLE}")
    set(${out} "${Python3_EXECUTABLE}" PARENT_SCOPE)
  else()
    set(${out} "" PARENT_SCOPE)
  endif()
endfunction()
