SET 'pipeline.name' = 'nexmark-q1';
SET 'execution.runtime-mode' = 'streaming';
SET 'parallelism.default' = '@PARALLELISM@';
SET 'table.dml-sync' = 'false';

CREATE TABLE bid (
  auction BIGINT,
  bidder BIGINT,
  price BIGINT,
  channel STRING,
  url STRING,
  extra STRING,
  date_time AS CAST(CURRENT_TIMESTAMP AS TIMESTAMP(3)),
  WATERMARK FOR date_time AS date_time - INTERVAL '1' SECOND
) WITH (
  'connector' = 'datagen',
  'number-of-rows' = '@ROWS@',
  'rows-per-second' = '1000000000',
  'fields.auction.min' = '1000',
  'fields.auction.max' = '10999',
  'fields.bidder.min' = '1000',
  'fields.bidder.max' = '1999',
  'fields.price.min' = '100',
  'fields.price.max' = '10000000',
  'fields.channel.length' = '8',
  'fields.url.length' = '60',
  'fields.extra.length' = '100'
);

CREATE TABLE sink (auction BIGINT, bidder BIGINT, price DECIMAL(23, 3), date_time TIMESTAMP(3))
  WITH ('connector' = 'blackhole');

INSERT INTO sink SELECT auction, bidder, 0.908 * price AS price, date_time FROM bid;
