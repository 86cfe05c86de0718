#include <catch2/catch.hpp>

#include "tests/fixtures.h"

using namespace hetplan;

TEST_CASE("synthetic fixture: 10-layer A100/V100 set with tp and bs up to 128", "[fixture]") {
  REQUIRE_SHARED_DATA();
  const ProfileSet& p = test::synthetic_profiles(10);
  REQUIRE(p.device_types() == std::vector<std::string>{"A100", "V100"});
  REQUIRE(p.entries().size() == 128);
  REQUIRE(p.num_layers() == 10);
  const Cluster c = test::table1_cluster(16);
  REQUIRE(c.num_devices() == 32);
  REQUIRE(c.device_types() == std::vector<std::string>{"A100", "V100"});
}
