-- wrk script for the soak (spec/10-soak_spec.lua): a unique id in every request's path, and
-- responses that are not exactly that id are counted.
-- luacheck: globals request wrk
local counter = 0
request = function()
  counter = counter + 1
  return wrk.format("GET", "/?id=" .. counter)
end
