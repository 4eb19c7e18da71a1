#include "compiler/InitAll.h"
int main(int argc, char **argv) { return mhcc::runMhcc(argc, argv); }
