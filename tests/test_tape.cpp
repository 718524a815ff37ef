#define BOOST_TEST_MODULE test_tape
#include "support.hpp"
