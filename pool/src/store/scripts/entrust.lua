-- Leaves what a closing worker remembers of some jobs (hand-offs, orphans
-- it left, runs it saw end) with a worker that stays, as a `keep` entry in
-- that worker's inbox: once read, the jobs are remembered by a live
-- process again, which gives them back (or makes their ends stand) after a
-- loss of Redis's data (see custody.rs).
-- KEYS: base, 9 the receiving worker's inbox, 10 cleanup hash,
--       11 keep-alive hash
-- ARGV: base, 4 receiving worker ('': none, which asks only whether the
--       pool recovers), 5 encoded entry, 6 maxlen, 7 ttl ms
-- Returns {entry id, identity} where identity is "<run id> <generation>"
-- (a later `entrusted_left` with another identity means Redis may have
-- lost the entry unread), {'silent'} when the worker is silent for over a
-- TTL (dead), or {} when it is not active (gone, being cleaned up,
-- drained). While the pool recovers from a loss, a worker Redis does not
-- know, or knows only from before the loss, may be back within a renewal:
-- {'recovering'} when it is not registered or silent then.
local ttl = tonumber(ARGV[7])
local reading, silent = worker_reading(ARGV[4], KEYS[10], KEYS[11], ttl)
if not reading then
  if (silent or not mget(WORKERS, ARGV[4])) and recovering(ttl) then
    return {'recovering'}
  end
  return silent and {'silent'} or {}
end
local id = stream_add(KEYS[9], 'keep', ARGV[5], tonumber(ARGV[6]))
return {id, (server_run_id() or '') .. ' ' .. data_generation()}
