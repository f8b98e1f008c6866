// main() for the standalone test_ops program (BACKPLANE_CONFORMANCE_STANDALONE_TESTS).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
