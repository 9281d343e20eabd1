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
-- The caller may name the server it checked last: when this one is not
-- it (another run id, or the pool's data of another generation), the
-- window opens here too, as `begin_recovery.lua` would open it, so the
-- node that found the change recovers one round trip sooner (a loaded
-- node's second call took 26 ms at p90, 320 ms at worst, while its workers
-- waited to re-assert: chaos soak seed 1587).
-- KEYS: base
-- ARGV: base, 4 worker ttl ms, 5 "<run id> <generation>" the caller
--       checked last ('': none)
-- Returns "<run id> <generation> <window>" (run id '' when INFO shows
--       none); window: 'opened' | 'open' (open already) when the caller
--       named another server, else '-'
local ttl = tonumber(ARGV[4])
local run_id, changed = server_changed()
local window = '-'
if changed then
  window = open_recovery_window(ttl) and 'opened' or 'open'
end
local generation = data_generation()
local known = ARGV[5] or ''
if run_id and known ~= '' and known ~= run_id .. ' ' .. generation then
  if window == '-' then
    window = open_recovery_window(ttl) and 'opened' or 'open'
  end
else
  window = '-'
end
return (run_id or '') .. ' ' .. generation .. ' ' .. window
