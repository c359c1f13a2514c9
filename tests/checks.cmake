# Checks of the source tree itself, in Python (issue 42, items 3 and 4), included by
# tests/CMakeLists.txt: every quoted include of ours is used, and docs/architecture.md's path from
# `main` to the all-reduce names functions that exist where it says, with the true hop count.
# (The layering check, which also holds a layer's files off its top header, is in CMakeLists.txt.)
add_test(NAME Includes.EveryIncludeOfOursIsUsed
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/include_check.py
                 ${PROJECT_SOURCE_DIR})
add_test(NAME Includes.APlantedUnusedIncludeFailsTheCheck
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/include_check.py --self-test)
add_test(NAME Docs.ArchitectureOneStepNamesRealFunctions
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/docs/check_architecture.py
                 ${PROJECT_SOURCE_DIR})
add_test(NAME Docs.ArchitectureCheckCatchesAPlantedMistake
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/docs/check_architecture.py
                 --self-test)
set_tests_properties(Includes.EveryIncludeOfOursIsUsed Docs.ArchitectureOneStepNamesRealFunctions
                     PROPERTIES LABELS "scripts")
set_tests_properties(Includes.APlantedUnusedIncludeFailsTheCheck
                     Docs.ArchitectureCheckCatchesAPlantedMistake PROPERTIES LABELS "scripts;slow")
