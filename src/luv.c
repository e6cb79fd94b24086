/*
** luv.c - the luv trampoline (see the luv integration issue).
*/
#include "core.h"

const luaL_Reg ah_luv_funcs[] = {
  {NULL, NULL}
};
