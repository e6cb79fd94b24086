/*
** frames.h - immutable copy-on-write frames and AsyncLocal values.
*/
#ifndef AH_FRAMES_H
#define AH_FRAMES_H

#include "ah.h"

/* the frame metatables, the empty frame, the frame functions */
void ah_open_frames(lua_State *L);

#endif
