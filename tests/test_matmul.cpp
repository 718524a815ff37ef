#define BOOST_TEST_MODULE test_matmul
#include "support.hpp"
