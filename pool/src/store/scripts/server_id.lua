-- The identity of the Redis server that holds the pool's keys: its run id,
-- which changes when that server restarts or another one takes over (the
-- moments Redis may lose writes). The scripts that admit, route or record
-- starts compare it with the one the caller read last (`went_back` in
-- base.lua). When the pool's scripts last ran on another server and no
-- script has seen the change yet, this opens the recovery window too: a
-- node that joins after a restart, or checks the server while nothing is
-- dispatched, does not leave the change for a later admission to find.
-- It also reads the generation of the pool's data, a field of the fencing
-- hash made here when missing: it changes only when Redis lost that hash
-- (an empty restart, a FLUSHALL, the pool's keys deleted), and so shows a
-- loss on a server that kept running, with the same run id, to a node
-- that mirrors no map and would otherwise notice it only at its next
-- admission.
-- KEYS: base
-- ARGV: base, 4 worker ttl ms
-- Returns "<run id> <generation>" (run id '' when INFO shows none)
local run_id, changed = server_changed()
if changed then
  open_recovery_window(tonumber(ARGV[4]))
end
return (run_id or '') .. ' ' .. data_generation()
