-- Forgets the pool on this server once its keys are deleted
-- (`Node::shutdown`): a join after it starts a new pool at once, rather
-- than take the missing epoch for a loss (`create_epoch.lua`). Deletes the
-- fencing hash again, in case a straggler's script wrote it meanwhile.
-- KEYS: base
-- ARGV: base
epoch_held[FENCING] = nil
redis.call('DEL', FENCING)
return 0
