// Everything in this module is a static inline function or a declaration in
// include/CMainspringSystem.h; the package manager needs one source file to build it.
#include "CMainspringSystem.h"
