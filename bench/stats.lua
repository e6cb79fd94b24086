--- Statistics for the benchmarks that run on every runtime (Lua 5.1
-- syntax: LuaJIT, Lua 5.1 to 5.4, Neovim).
local S = {}

--- The median of the numbers in list t (t is not changed).
function S.median(t)
  local s = {}
  for i = 1, #t do s[i] = t[i] end
  table.sort(s)
  local n = #s
  if n % 2 == 1 then return s[(n + 1) / 2] end
  return (s[n / 2] + s[n / 2 + 1]) / 2
end

return S
