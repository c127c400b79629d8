# MPI backend tests (included from tests/comm/CMakeLists.txt): one rank per process under
# mpirun, so the binary has its own main() (mpi_main.cpp) instead of gtest_main, and ctest
# runs mpirun rather than discovering cases. The flags are Open MPI's: root in containers,
# more ranks than cores on small machines.
if(MPI_C_FOUND AND MPIEXEC_EXECUTABLE AND TARGET krab_comm)
  add_executable(comm_mpi_test ${CMAKE_CURRENT_LIST_DIR}/mpi_main.cpp
                               ${CMAKE_CURRENT_LIST_DIR}/collective_suite.cpp)
  target_link_libraries(comm_mpi_test PRIVATE krab_comm GTest::gtest)
  krab_torch_target(comm_mpi_test)

  set(_krab_mpirun ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe)
  foreach(np 1 2 3)
    add_test(NAME comm_mpi_np${np}
             COMMAND ${_krab_mpirun} -np ${np} $<TARGET_FILE:comm_mpi_test>)
    set_tests_properties(comm_mpi_np${np} PROPERTIES TIMEOUT 120 LABELS "comm;mpi")
  endforeach()

  # Rank 1 never joins an allreduce; rank 0 must time out after 1 s and end the job with
  # MPI_Abort. The exit status of an aborted job is the launcher's business, so the verdict is
  # the line rank 0 prints only when every check passed.
  add_test(NAME comm_mpi_timeout
           COMMAND ${_krab_mpirun} -np 2 $<TARGET_FILE:comm_mpi_test> --hang-test)
  set_tests_properties(comm_mpi_timeout PROPERTIES TIMEOUT 60 LABELS "comm;mpi"
                       PASS_REGULAR_EXPRESSION "hang-test PASS"
                       FAIL_REGULAR_EXPRESSION "hang-test FAILED")

  # Same hang, but rank 0 returns from main(): the static guard must abort the job (exit 1)
  # instead of waiting in MPI_Finalize for rank 1.
  add_test(NAME comm_mpi_timeout_at_exit
           COMMAND ${_krab_mpirun} -np 2 $<TARGET_FILE:comm_mpi_test> --hang-exit-test)
  set_tests_properties(comm_mpi_timeout_at_exit PROPERTIES TIMEOUT 60 LABELS "comm;mpi"
                       PASS_REGULAR_EXPRESSION "still pending at exit"
                       FAIL_REGULAR_EXPRESSION "hang-test FAILED")
endif()
