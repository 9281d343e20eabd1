-- Creates the pool's epoch at a node's join, unless it exists (see
-- `recovering` in base.lua). A pool with no epoch is new, or Redis lost its
-- data. This server tells the two apart when the loss happened while it
-- ran (a FLUSHALL, the pool's keys deleted): it held the pool's epoch
-- before (`epoch_held`), and the join opens the recovery window as any
-- script that finds the epoch gone would. Otherwise the join writes a
-- closed epoch and the pool starts at once; a loss it cannot tell (an
-- empty restart) is found by the nodes that knew the server before, by its
-- run id.
-- KEYS: base
-- ARGV: base, 4 worker ttl ms
-- Returns 1 when the join opened the recovery window, else 0.
if control_field(C_EPOCH) then
  return 0
end
if epoch_held[FENCING] then
  open_recovery_window(tonumber(ARGV[4]))
  return 1
end
set_control_field(C_EPOCH, EPOCH, '0 0')
return 0
