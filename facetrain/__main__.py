from facetrain.cli import main

main()
