#include "runtime/cli/Mhcrun.h"
int main(int argc, char **argv) { return mhcc::runtime::runMhcrun(argc, argv); }
