#define BOOST_TEST_MODULE test_tensor
#include "support.hpp"
