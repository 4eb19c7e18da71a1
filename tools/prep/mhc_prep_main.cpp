#include "tools/prep/Prep.h"
int main(int argc, char **argv) { return mhcc::prep::runPrep(argc, argv); }
