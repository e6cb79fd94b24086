/*
** luv.h - the luv integration (src/luv/): luv callbacks run in the
** context of their registration.  What the module entry needs of it.
*/
#ifndef AH_LUV_H
#define AH_LUV_H

#include "../ah.h"

/* module table on top: the luv functions, the lazy resources of running
** callbacks (st->lazy_resource) */
void ah_open_luv(lua_State *L);
/* table on top: its fast_callbacks field (0 before luv was attached) */
void ah_luv_stats(lua_State *L);

#endif
