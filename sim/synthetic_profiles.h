// Synthetic profile sets, made from a base set the way Metis's
// gen_synth_data.py LAYERS MAX_BS makes them, value for value:
//
//  1. each A100 sample gains between_forward_backward_time_ms and num_MHA_layers;
//  2. it is stretched to LAYERS layers (first and last layer kept, the middle
//     one repeated; layernorm all-reduce and optimizer times scale by LAYERS/10);
//  3. bs is doubled from 4 up to MAX_BS for tp 1, 2 and 4 (times x2), then tp
//     is doubled from 4 up to MAX_BS for every bs (times / 2);
//  4. every A100 file is copied to V100 with all times x 3.5.
//
// Files are written in the layout of Python's json.dump(indent=2), so they
// compare byte for byte with the reference's.
#pragma once

#include <string>
#include <vector>

namespace hetplan {

// Reads DeviceType.A100_tp{1,2,4}_bs{1,2,4}.json from `samples_dir` and
// writes the set into `out_dir` (created if needed; other files are left
// alone). Returns the file names written, sorted. Throws InputError.
std::vector<std::string> generate_synthetic_profiles(const std::string& samples_dir, const std::string& out_dir,
                                                     int layers, int max_bs);

}  // namespace hetplan
