// `backplane bench` on a device list: transfers, split graphs, placement time.
#pragma once

#include <backplane/backplane.hpp>
#include <string>
#include <vector>

namespace backplane::cli {

// Appends its records to `results` with --json, else prints table rows.
// `list` holds at least two devices; the first two are measured.
void bench_multidevice(Runtime& rt, const std::vector<Device*>& list, const std::string& filter,
                       double min_time, bool json, Json& results);

// upload_256M / download_256M on one device.
void bench_io(Runtime& rt, Device& dev, const std::string& filter, double min_time, bool json, Json& results);

}  // namespace backplane::cli
