#define BOOST_TEST_MODULE test_gradcheck
#include "support.hpp"
