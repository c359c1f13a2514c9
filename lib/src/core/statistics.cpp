// Summary statistics. See statistics.h.
#include "dptrain/core/statistics.h"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <vector>

namespace dptrain {

double median_or_nan(std::vector<double> values) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : (values[middle - 1] + values[middle]) / 2;
}

}  // namespace dptrain
