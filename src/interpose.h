/*
** interpose.h - stand-ins for another library's C methods that keep its
** argument errors its own: module.interpose.
*/
#ifndef AH_INTERPOSE_H
#define AH_INTERPOSE_H

#include "ah.h"

/* module.interpose(orig, mt, impl, post) */
void ah_open_interpose(lua_State *L);

#endif
