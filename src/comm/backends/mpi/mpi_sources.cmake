# MPI backend sources for krab_comm (included from src/comm/CMakeLists.txt). Only this folder
# includes mpi.h; users of krab_comm see KRAB_HAVE_MPI and the declarations in
# mpi_communicator.h. Without MPI the factory answers 'mpi' with NotSupported.
if(MPI_C_FOUND)
  target_sources(krab_comm PRIVATE ${CMAKE_CURRENT_LIST_DIR}/mpi_communicator.cpp
                                   ${CMAKE_CURRENT_LIST_DIR}/mpi_runtime.cpp)
  target_link_libraries(krab_comm PUBLIC MPI::MPI_C)
  target_compile_definitions(krab_comm PUBLIC KRAB_HAVE_MPI)
endif()
