// The flags of the training recipe beyond the book's (dptrain/train/recipe.h): their help, their
// values, and the named presets that --recipe stands for. Not here: the other train flags
// (cli.cpp) or what the recipe does (lib/).
#pragma once

#include <cxxopts.hpp>
#include <string>
#include <vector>

#include "dptrain/train/recipe.h"

namespace dptrain {

// The "Recipe" group of `dptrain train --help`.
void add_recipe_flags(cxxopts::Options& options);

// The recipe the flags give (every flag not given: the book's).
Recipe read_recipe_flags(const cxxopts::ParseResult& result);

// Note [A preset is the flags it stands for]
// `--recipe NAME` is replaced, where it stands on the command line, by the flags of the preset
// NAME (kRecipePresets in recipe_flags.cpp), so that a flag given after it overrides the preset's
// value and one given before it is overridden, as with any flag given twice. Returns the
// preset's flags, each flag and value its own argument; a UsageError names the presets when NAME
// is none of them.
std::vector<std::string> recipe_preset_arguments(const std::string& name);

}  // namespace dptrain
